"""Load models trained and saved under JAX, in a fresh TensorFlow process, and export them.

Run by tests/test_backends_distribution.py as `python serve_on_tensorflow.py FOLDER` with
`KERAS_BACKEND=tensorflow`, after tests/backends/test_distribution.py wrote
`FOLDER/trained.keras` and `FOLDER/jax_outputs.npz` (the encoder) and
`FOLDER/decoder_step.keras` and `FOLDER/jax_decoder_outputs.npz` (the decoder's step
model). It prints one `RESULT {json}` line: the Keras-under-TensorFlow outputs against
JAX's, the export report of `keras_posenc.export` (SavedModel, ONNX, LiteRT,
`verify_export`) for the encoder, and `save_decoder`'s verification for the decoder.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import keras
import numpy as np
import tiny_decoder
import tiny_encoder  # noqa: F401 - registers RotarySelfAttention for loading

from keras_posenc.export import (
    save_decoder,
    save_litert,
    save_onnx,
    save_saved_model,
    verify_export,
)


def main(folder: Path) -> dict:
    assert keras.backend.backend() == "tensorflow"
    model = keras.saving.load_model(folder / "trained.keras", compile=False)
    jax_outputs = np.load(folder / "jax_outputs.npz")
    differences, sizes = {}, {}
    for name in jax_outputs.files:
        if name.startswith("tokens"):
            expected = jax_outputs[name.replace("tokens", "logits")]
            got = keras.ops.convert_to_numpy(model(jax_outputs[name]))
            differences[name] = float(np.max(np.abs(got - expected)))
            sizes[name] = float(np.max(np.abs(expected)))
    # Keras's `model.export(format="tf_saved_model")` from JAX, reloaded here: its
    # XlaCallModule holds StableHLO at the version the writing jax targets, which this
    # TensorFlow may not read (the error is returned for the test to judge).
    import tensorflow as tf

    keras_export, keras_export_error = None, None
    try:
        served = tf.saved_model.load(str(folder / "keras_export"))
        tokens = jax_outputs["tokens_16"]
        outputs = served.serve(tokens).numpy()
        keras_export = float(np.max(np.abs(outputs - jax_outputs["logits_16"])))
    except Exception as error:  # noqa: BLE001 - reported, and judged by the test
        keras_export_error = f"{type(error).__name__}: {error}"
    artifacts = folder / "artifacts"
    artifacts.mkdir()
    save_saved_model(model, artifacts / "saved_model")
    save_onnx(model, artifacts / "model.onnx")
    save_litert(model, artifacts / "model.tflite")
    report = verify_export(
        model,
        artifacts / "saved_model",
        artifacts / "model.onnx",
        litert_path=artifacts / "model.tflite",
        batch_sizes=(1, 3),
        repeats=1,
        timed_shapes=(),
        raise_on_failure=False,
    )
    decoder = serve_decoder(folder)
    return {
        "decoder": decoder,
        "max_abs_difference": differences,
        "max_abs_output": sizes,
        "keras_export_max_abs_difference": keras_export,
        "keras_export_error": keras_export_error,
        "tensorflow_version": tf.__version__,
        "summary": report["summary"],
        "passed": report["passed"],
    }


def serve_decoder(folder: Path) -> dict:
    """The decoder's step model: its logits here against JAX's on the same tokens, and
    `save_decoder` (onnxruntime-genai's GroupQueryAttention graph and LiteRT), verified."""
    step = keras.saving.load_model(folder / "decoder_step.keras", compile=False)
    jax_outputs = dict(np.load(folder / "jax_decoder_outputs.npz"))
    here = tiny_decoder.greedy_probe(step, tokens_after=jax_outputs)
    differences, sizes = {}, {}
    for name in jax_outputs:
        if name.startswith("logits"):
            differences[name] = float(np.max(np.abs(here[name] - jax_outputs[name])))
            sizes[name] = float(np.max(np.abs(jax_outputs[name])))
    report = save_decoder(
        step,
        folder / "artifacts" / "decoder",
        max_length=tiny_decoder.MAX_LENGTH,
        formats=("onnx", "litert"),
    )
    runtimes = {
        f"{case['name']}/{runtime}": {
            "passed": result["passed"],
            "max_abs_error": result["max_abs_error"],
        }
        for case in report["cases"]
        for runtime, result in case["runtimes"].items()
    }
    return {
        "max_abs_difference": differences,
        "max_abs_output": sizes,
        "save_decoder": runtimes,
        "passed": report["passed"],
    }


if __name__ == "__main__":
    print("RESULT " + json.dumps(main(Path(sys.argv[1]))))
