"""Which exports need TensorFlow, and the error that says so on JAX and PyTorch.

`save_decoder`'s ONNX folder is written from weights read as numpy arrays and verified
against Keras on whatever backend runs it, so it exports from JAX, PyTorch and
TensorFlow alike. Everything else traces the model into a TensorFlow graph: a SavedModel
is TensorFlow's own format, tf2onnx and the LiteRT converter read TensorFlow graphs, and
`verify_export` runs the SavedModel it checks. On another backend these refuse at once,
before anything is written, saying how to get there: a `.keras` file is backend-free, so
the model saved on JAX or PyTorch loads in a process started under TensorFlow.
"""

from __future__ import annotations

import keras

from keras_posenc.export.errors import ExportError

# Entry -> why it needs TensorFlow.
TENSORFLOW_ENTRIES = {
    "save_saved_model": "a SavedModel is TensorFlow's own format",
    "save_onnx": "tf2onnx converts the model's TensorFlow graph",
    "onnx_model": "tf2onnx converts the model's TensorFlow graph",
    "save_litert": "the LiteRT converter reads the model's TensorFlow graph",
    "litert_flatbuffer": "the LiteRT converter reads the model's TensorFlow graph",
    "verify_export": "it runs the model and its SavedModel in TensorFlow",
    "serving_function": "it is a tf.function",
    "save_decoder(formats=litert)": "the LiteRT converter reads a TensorFlow graph",
}


def requires_tensorflow(entry: str) -> None:
    """Raises unless Keras runs on TensorFlow; `entry` is a key of `TENSORFLOW_ENTRIES`.

    Raises:
        ExportError: Keras runs on another backend; the message names `entry`, why it
            needs TensorFlow, and the way round (a `.keras` file exported under
            `KERAS_BACKEND=tensorflow`).
    """
    backend = keras.backend.backend()
    if backend == "tensorflow":
        return
    raise ExportError(
        f"{entry} needs TensorFlow ({TENSORFLOW_ENTRIES[entry]}), and Keras runs on {backend} "
        f"in this process (KERAS_BACKEND={backend}). Nothing was written. Save the model "
        "(`model.save('model.keras')`: the file is backend-free) and export it in a process "
        "started with KERAS_BACKEND=tensorflow (`keras-posenc-export --model model.keras` "
        "always runs on TensorFlow). save_decoder's ONNX folder (formats=('onnx',)) "
        f"exports from {backend} as it is."
    )


def refusing(entry: str):
    """A stand-in for `entry` on JAX and PyTorch that raises `requires_tensorflow`'s error
    when called (without importing TensorFlow, which the real one's module does)."""

    def call(*args, **kwargs):
        requires_tensorflow(entry)

    call.__name__ = call.__qualname__ = entry
    call.__doc__ = f"{entry} needs TensorFlow: on this backend it refuses (`requires_tensorflow`)."
    return call
