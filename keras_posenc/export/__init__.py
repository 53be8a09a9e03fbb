"""Export a Keras model to SavedModel, ONNX and LiteRT, and check each against Keras.

All artifacts come from one serving function: a `tf.function` with an explicit, named
`tf.TensorSpec` per model input, which keeps the sizes the model's inputs fix and leaves
the others (usually batch and sequence) dynamic. The layers of this package turn their
host tables into constants while that function is traced, so the ONNX graph holds plain
constants and its inputs are exactly the signature's (an eager `tf.constant` captured by a
layer would appear as an extra input, and `save_onnx` refuses such a graph).

`verify_export` runs Keras and each artifact side by side on shapes other than any traced
one, with starts and positions that reach every position table near its first and last
rows, and reports, per case, the largest absolute and relative error of each runtime
against Keras and each runtime's median latency.

One module per concern: `signature` (the serving function), `precision`, `files` (whole
or nothing), `saved_model`, `onnx_export` (its graph passes: the subpackage
`onnx_passes`), `litert`, and the subpackage `verify` (`coverage`, what is verified;
`runtimes`; `compare`; `report`; `driver`), `masks` (`causal_mask`). The export job
(`python -m export`, `keras-posenc-export`) and its demo encoders are `keras_posenc_cli`,
which imports this package (never the reverse). Every public name is importable from here.

Example:

```python
from keras_posenc import SinusoidalPositionalEncoding
from keras_posenc.export import save_litert, save_onnx, save_saved_model, verify_export

inputs = keras.Input((None, 8), name="embeddings")
model = keras.Model(inputs, SinusoidalPositionalEncoding()(inputs))
save_saved_model(model, "out/saved_model")
save_onnx(model, "out/model.onnx")
save_litert(model, "out/model.tflite")
report = verify_export(  # raises if it fails
    model, "out/saved_model", "out/model.onnx", litert_path="out/model.tflite"
)
print(report["summary"]["litert"]["max_abs_error"])
```
"""

import importlib

from keras_posenc.export.backend import TENSORFLOW_ENTRIES, refusing, requires_tensorflow
from keras_posenc.export.decoder import save_decoder
from keras_posenc.export.errors import ExportError, VerificationError
from keras_posenc.export.files import (
    is_saved_model,
    recover,
    recover_interrupted,
    whole_or_nothing,
    write_json,
    written_by_package,
)
from keras_posenc.export.masks import causal_mask
from keras_posenc.export.onnx_passes import dedupe_constants
from keras_posenc.export.precision import (
    BFLOAT16_CHOICES,
    compute_dtypes,
    exportable_model,
    float32_copy,
)
from keras_posenc_startup import quiet_tensorflow_start

# The names whose modules import TensorFlow, by module: imported on first use, so that
# `save_decoder` runs on JAX and PyTorch without TensorFlow. There, the entries of
# `TENSORFLOW_ENTRIES` are stand-ins that refuse by name when called (`backend.py`).
_TENSORFLOW_MODULES = {
    "litert": ("litert_flatbuffer", "litert_interpreter", "litert_ops", "save_litert"),
    "onnx_export": (
        "DEFAULT_OPSET",
        "GRAPH_PASSES",
        "SUPPORTED_OPSETS",
        "onnx_constant_bytes",
        "onnx_model",
        "save_onnx",
    ),
    "saved_model": ("save_saved_model",),
    "signature": ("export_bound", "input_signature", "serving_function"),
    "verify": (
        "BATCH_SIZES",
        "FLOAT16_TOLERANCE",
        "FLOAT32_TOLERANCE",
        "RUNTIMES",
        "SEQUENCE_LENGTHS",
        "compare_outputs",
        "default_inputs",
        "litert_constant_bytes",
        "longest_sequence",
        "parameter_bytes",
        "position_inputs",
        "position_limit",
        "position_table_bytes",
        "saved_model_constant_bytes",
        "verification_cases",
        "verification_shapes",
        "verify_export",
    ),
}
_MODULE_OF = {name: module for module, names in _TENSORFLOW_MODULES.items() for name in names}


def __getattr__(name: str):
    """The TensorFlow exports, imported on first use (see `_TENSORFLOW_MODULES`); the
    package's submodules (`keras_posenc.export.litert`, ...) by name."""
    import keras

    module = _MODULE_OF.get(name)
    if module is None:
        try:
            value = importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as error:
            if error.name != f"{__name__}.{name}":
                raise
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    elif name in TENSORFLOW_ENTRIES and keras.backend.backend() != "tensorflow":
        return refusing(name)  # not kept: the backend is fixed, but this stays cheap
    else:
        with quiet_tensorflow_start():  # TensorFlow loads here where Keras runs on JAX or torch
            value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


__all__ = [
    "TENSORFLOW_ENTRIES",
    "requires_tensorflow",
    "BATCH_SIZES",
    "BFLOAT16_CHOICES",
    "DEFAULT_OPSET",
    "FLOAT16_TOLERANCE",
    "GRAPH_PASSES",
    "FLOAT32_TOLERANCE",
    "RUNTIMES",
    "SEQUENCE_LENGTHS",
    "SUPPORTED_OPSETS",
    "ExportError",
    "VerificationError",
    "causal_mask",
    "compare_outputs",
    "compute_dtypes",
    "dedupe_constants",
    "default_inputs",
    "export_bound",
    "exportable_model",
    "float32_copy",
    "input_signature",
    "litert_flatbuffer",
    "litert_constant_bytes",
    "litert_interpreter",
    "litert_ops",
    "position_inputs",
    "position_limit",
    "recover",
    "recover_interrupted",
    "save_decoder",
    "save_litert",
    "verification_cases",
    "written_by_package",
    "is_saved_model",
    "longest_sequence",
    "onnx_constant_bytes",
    "onnx_model",
    "parameter_bytes",
    "position_table_bytes",
    "save_onnx",
    "save_saved_model",
    "saved_model_constant_bytes",
    "serving_function",
    "verification_shapes",
    "verify_export",
    "whole_or_nothing",
    "write_json",
]
