"""A model's inputs, checked: every export starts here (no TensorFlow: every backend)."""

from __future__ import annotations

import keras

from keras_posenc.export.errors import ExportError


def model_inputs(model) -> list:
    """`model.inputs`, or an error saying how to make a model that has them."""
    if not isinstance(model, keras.Model):
        raise TypeError(f"Expected a keras.Model, got {type(model).__name__}.")
    try:
        inputs = model.inputs
    except AttributeError:
        inputs = None
    if not inputs:
        raise ExportError(
            f"The model {model.name!r} has no inputs to export (a subclassed model, or one "
            "that was never built). Export a functional model: "
            "`inputs = keras.Input(shape=(None,), dtype='int32', name='token_ids')`, "
            "`model = keras.Model(inputs, subclassed_model(inputs))`."
        )
    return list(inputs)
