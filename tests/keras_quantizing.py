"""Keras's `quantize()` without a full garbage collection for each variable it replaces,
and the tampered-file check the Keras-quantized tests share.

`keras.Layer.__delattr__` runs `gc.collect()` after each variable it deletes (to free a
device buffer sooner), and `quantize` deletes each kernel it replaces: a full collection of
the test session's heap per kernel, which grows with every model the session has built
(7-8 s CPU a tiny model late in tests/test_decoder_keras_quantized.py, more in the whole
suite's heap). Nothing the tests look at is freed by it; Python's own collections still
run.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

import keras
import pytest


@contextlib.contextmanager
def without_collection_per_variable() -> Iterator[None]:
    """Within it, `keras.Layer.__delattr__` deletes a variable as Keras does, but for its
    `gc.collect()`.

    Example:

    ```python
    with without_collection_per_variable():
        causal_lm.quantize("int8")
    ```
    """
    delete = keras.Layer.__delattr__

    def delete_without_collecting(layer, name):
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(gc, "collect", lambda generation=2: 0)
            delete(layer, name)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(keras.Layer, "__delattr__", delete_without_collecting)
        yield


def assert_each_tamper_fails(causal_lm, tampers, folder, max_length: int) -> None:
    """Writes `causal_lm`'s file unverified into `folder`, then for each function of
    `tampers` (which edits an `onnx.ModelProto` in place) verifies a tampered copy against
    the quantized model itself and asserts that it fails."""
    import onnx

    from keras_posenc.export import save_decoder
    from keras_posenc.export.decoder import save
    from keras_posenc.export.decoder.progress import Progress
    from keras_posenc.export.decoder.quantization_arguments import keras_quantization
    from keras_posenc.export.decoder.quantized_save import verify_quantized_decoder
    from keras_posenc.keras_hub import describe_causal_lm

    save_decoder(causal_lm, folder, max_length=max_length, verbose=0, verify=False)
    decoder = describe_causal_lm(causal_lm, max_length)
    quantization = keras_quantization(decoder, None, None, None, "gqa", ("onnx",))
    written = onnx.load(folder / "model.onnx")
    for tamper in tampers:
        tampered = onnx.ModelProto()
        tampered.CopyFrom(written)
        tamper(tampered)
        onnx.save(tampered, folder / "model.onnx")
        runtimes = save._runtimes(folder, ("onnx",), max_length, quantization)
        report = verify_quantized_decoder(
            causal_lm, decoder, True, runtimes, max_length, quantization, Progress(0, folder)
        )
        assert not report["passed"], tamper.__name__
