"""`LearnedPositionalEmbedding`: adds a trainable table `E[position]` to its input."""

from __future__ import annotations

import keras
import numpy as np

from keras_posenc.backend import keras_private
from keras_posenc.backend.lazy import tricks
from keras_posenc.layers.checks import (
    checked_call_input,
    checked_float_policy,
    checked_positive_int,
)
from keras_posenc.layers.host_integers import RefusesHostIntegersPastInt32
from keras_posenc.layers.sinusoidal import SinusoidalInitializer
from keras_posenc.tables.positions import position_rows, static_dim
from keras_posenc.tables.rows import TableRows

_LIMIT_HINT = (
    "build the layer with a larger max_length, or call "
    "resize(new_max_length) to interpolate the table."
)


class _VariableRows(TableRows):
    """Row access to a `(max_length, width)` variable, for `position_rows`: all rows ready."""

    def __init__(self, table):
        super().__init__((table,))


def _initializer(identifier):
    if identifier == "sinusoidal":
        return SinusoidalInitializer()
    return keras.initializers.get(identifier)


@keras.saving.register_keras_serializable(package="keras_posenc")
class LearnedPositionalEmbedding(RefusesHostIntegersPastInt32, keras.layers.Layer):
    """Adds a trainable position table to its input: `inputs + E[positions]`.

    The table `E` has `max_length` rows of the input width; positions past it are an
    error (resize the table with `resize`, by linear interpolation, to go further).

    Example:

    >>> tokens = keras.layers.Embedding(1000, 64)(np.array([[3, 1, 4, 1, 5]]))
    >>> layer = LearnedPositionalEmbedding(max_length=128)
    >>> tuple(layer(tokens).shape)
    (1, 5, 64)

    Args:
        max_length: the number of positions the table holds.
        embeddings_initializer: initializer of the table; `"sinusoidal"` starts from the
            sinusoidal encoding (`SinusoidalInitializer`).
        embeddings_regularizer: optional regularizer of the table.
        embeddings_constraint: optional constraint of the table.
        **kwargs: base layer arguments (`name`, `dtype`, ...).

    Call arguments:
        inputs: float tensor `(batch, sequence, width)`.
        positions: optional integer tensor `(sequence,)` or `(batch, sequence)`, each below
            `max_length`.
        start_index: the position of the first step when `positions` is not given: a Python
            int or a scalar int tensor (decoding with a cache).

    Input shape: `(batch, sequence, width)`. Output shape: the same. A Keras mask passes through.
    """

    def __init__(
        self,
        max_length: int,
        embeddings_initializer="glorot_uniform",
        embeddings_regularizer=None,
        embeddings_constraint=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.max_length = checked_positive_int(max_length, "max_length")
        self.embeddings_initializer = _initializer(embeddings_initializer)
        self.embeddings_regularizer = keras.regularizers.get(embeddings_regularizer)
        self.embeddings_constraint = keras.constraints.get(embeddings_constraint)
        checked_float_policy(self)
        self.supports_masking = True

    def build(self, input_shape) -> None:
        if len(input_shape) != 3 or input_shape[-1] is None:
            raise ValueError(
                "LearnedPositionalEmbedding expects inputs of shape (batch, sequence, width) "
                f"with a known width, got shape {tuple(input_shape)}."
            )
        self.embeddings = self._add_table(
            self.max_length, input_shape[-1], self.embeddings_initializer
        )
        super().build(input_shape)

    def _add_table(self, length: int, width: int, initializer):
        return self.add_weight(
            shape=(length, width),
            initializer=initializer,
            regularizer=self.embeddings_regularizer,
            constraint=self.embeddings_constraint,
            name="embeddings",
            # Read in the variable dtype (float32 under mixed policies): `call` adds in
            # float32 and rounds the sum once.
            autocast=False,
        )

    def call(self, inputs, positions=None, start_index=0):
        t = tricks()
        checked_call_input(self, inputs, 3, {-1: self.embeddings.shape[1]})
        outputs = position_rows(
            _VariableRows(self.embeddings),
            static_dim(inputs, 1),
            positions,
            start_index,
            limit=self.max_length,
            limit_hint=_LIMIT_HINT,
            combine=lambda embedding: t.add_rounded_once(inputs, embedding),
            batch=static_dim(inputs, 0),
            traced=t.is_traced(inputs),
        )
        t.keep_static_shape(outputs, inputs.shape)  # as SinusoidalPositionalEncoding
        return outputs

    def resize(self, new_max_length: int) -> None:
        """Grows or shrinks the table to `new_max_length` rows by linear interpolation.

        Row `j` of the new table is the old table read at position
        `j·(max_length - 1)/(new_max_length - 1)` (first and last rows stay). Retrace any
        `tf.function` and recompile the model afterwards: they hold the old table.
        """
        new_max_length = checked_positive_int(new_max_length, "new_max_length")
        if not self.built:
            self.max_length = new_max_length
            return
        old = keras.ops.convert_to_numpy(self.embeddings).astype(np.float64)
        where = np.linspace(0.0, self.max_length - 1, new_max_length)
        below = np.floor(where).astype(int)
        above = np.minimum(below + 1, self.max_length - 1)
        weight = (where - below)[:, None]
        new = (1.0 - weight) * old[below] + weight * old[above]

        self.embeddings = keras_private.replace_weight(
            self, self.embeddings, lambda: self._add_table(new_max_length, old.shape[1], "zeros")
        )
        self.embeddings.assign(new.astype(self.embeddings.dtype))
        self.max_length = new_max_length

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self) -> dict:
        config = super().get_config()
        config.update(
            {
                "max_length": self.max_length,
                "embeddings_initializer": keras.initializers.serialize(self.embeddings_initializer),
                "embeddings_regularizer": keras.regularizers.serialize(self.embeddings_regularizer),
                "embeddings_constraint": keras.constraints.serialize(self.embeddings_constraint),
            }
        )
        return config
