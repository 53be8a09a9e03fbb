"""Load a model trained and saved under JAX, in a fresh TensorFlow process, and export it.

Run by tests/test_backends_distribution.py as `python serve_on_tensorflow.py FOLDER` with
`KERAS_BACKEND=tensorflow`, after tests/backends/test_distribution.py wrote
`FOLDER/trained.keras` and `FOLDER/jax_outputs.npz`. It prints one `RESULT {json}` line:
the Keras-under-TensorFlow outputs against JAX's, and the export report of
`keras_posenc.export` (SavedModel, ONNX, LiteRT, `verify_export`).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import keras
import numpy as np
import tiny_encoder  # noqa: F401 - registers RotarySelfAttention for loading

from keras_posenc.export import save_litert, save_onnx, save_saved_model, verify_export


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
    return {
        "max_abs_difference": differences,
        "max_abs_output": sizes,
        "keras_export_max_abs_difference": keras_export,
        "keras_export_error": keras_export_error,
        "tensorflow_version": tf.__version__,
        "summary": report["summary"],
        "passed": report["passed"],
    }


if __name__ == "__main__":
    print("RESULT " + json.dumps(main(Path(sys.argv[1]))))
