"""SavedModel: the serving function as a `serving_default` signature."""

from __future__ import annotations

import os
from pathlib import Path

import keras

from keras_posenc.backend import tensorflow as tf_backend
from keras_posenc.export.backend import requires_tensorflow
from keras_posenc.export.files import is_saved_model, whole_or_nothing
from keras_posenc.export.precision import exportable_model
from keras_posenc.export.signature import bounded_tracing, input_signature, serving_function


def save_saved_model(
    model: keras.Model,
    path: str | os.PathLike,
    *,
    bfloat16: str = "float32",
    max_sequence_length: int | None = None,
) -> Path:
    """Writes `model` as a SavedModel with a `serving_default` signature.

    The signature takes the model's inputs by name, with dynamic batch and sequence axes,
    and returns a dict of the model's named outputs. The SavedModel loads with
    `tf.saved_model.load` alone: no Keras and no `keras_posenc` needed. Each weight and
    each position table is stored once.

    Example:

    ```python
    save_saved_model(model, "out/saved_model")
    # Elsewhere, with TensorFlow alone:
    serve = tf.saved_model.load("out/saved_model").signatures["serving_default"]
    serve(token_ids=tf.constant([[3, 1, 4]]))["encoded"]  # (1, 3, width)
    ```

    Args:
        model: a functional or `Sequential` Keras model.
        path: the SavedModel folder to write. Its parent folder must exist; an existing
            SavedModel there is replaced, anything else is left alone (an error).
        bfloat16: what to do with a bfloat16 model: `"float32"` exports a float32 copy
            (with a warning), `"error"` refuses. TensorFlow could serve bfloat16, but the
            SavedModel holds the same model as the ONNX file so that both can be checked.
        max_sequence_length: the largest position + 1 the SavedModel serves (with a
            `start_index` input: start plus length stay within it). Its position tables
            then hold only the rows below it, and a call past it raises. Default: the
            smallest learned position table of the model, else no bound.

    Returns:
        The path written.
    """
    requires_tensorflow("save_saved_model")  # before anything is written
    model, _ = exportable_model(model, bfloat16)
    specs = input_signature(model)
    with (
        whole_or_nothing(path, replace_if=is_saved_model, kind="folder") as written,
        bounded_tracing(model, max_sequence_length),
        tf_backend.tables_stored_once(),
    ):
        archive = keras.export.ExportArchive()
        # Tracked for its resources (lookup tables) only: tracking the model itself lists
        # its Keras variables, and the checkpoint then saves every weight twice (once
        # per Keras variable, once per TensorFlow variable the function reads, which
        # `write_out` adds). The function's variables are saved whatever is tracked.
        archive.track(_Resources(model))
        archive.add_endpoint("serving_default", serving_function(model).python_function, specs)
        archive.write_out(str(written), verbose=False)
    return Path(path)


class _Resources(tf_backend.AutoTrackable):
    """Holds the model, so that `ExportArchive` finds its resources but lists no weight."""

    def __init__(self, model: keras.Model):
        self.model = model
