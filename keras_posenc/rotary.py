"""`RotaryEmbedding`: rotates channel pairs of queries and keys by `position·ω` (RoPE).

For a pair `(a, b)` at position `i` with frequency `ω`:
`(a, b) -> (a·cos(iω) - b·sin(iω), b·cos(iω) + a·sin(iω))`, so `q_i·k_j` depends on `i - j` only.
Written for the whole vector: `y = x·C + swap(x)·S`, where `swap` exchanges the two
channels of every pair and the tables hold `C = cos` and `S = ∓sin` (minus on a pair's
first channel) per channel. Both tables come ready from the shared frequency table, so a
call is two multiplies, one swap and one add.
"""

from __future__ import annotations

import keras
import tensorflow as tf

from keras_posenc.frequencies import (
    MAX_POSITIONS,
    FrequencyTable,
    PositionTable,
    checked_choice,
    checked_even_width,
    checked_max_wavelength,
    inverse_frequencies,
    position_table,
)
from keras_posenc.positions import position_rows, static_dim

LAYOUTS = ("half", "interleaved")


def _pair_axes(layout: str, rotary_dim: int) -> tuple[list[int], int]:
    # "half" pairs channel k with k + D/2: view the channels as (2, D/2), pairs along axis 0.
    # "interleaved" pairs 2k with 2k + 1: view them as (D/2, 2), pairs along axis 1.
    half = rotary_dim // 2
    return ([2, half], 0) if layout == "half" else ([half, 2], 1)


def _rotation_tables(layout: str, sin: tf.Tensor, cos: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """`(C, S)` per channel from `(sin, cos)` per pair, both `(..., rotary_dim)`."""
    pair_axis = -2 if layout == "half" else -1
    shape = tf.concat([tf.shape(sin)[:-1], [2 * sin.shape[-1]]], 0)
    cos_table = tf.reshape(tf.stack([cos, cos], axis=pair_axis), shape)
    sin_table = tf.reshape(tf.stack([-sin, sin], axis=pair_axis), shape)
    return cos_table, sin_table


def swap_pairs(x: tf.Tensor, layout: str, axis: int = -1) -> tf.Tensor:
    """Exchange the two channels of every rotation pair along `axis` (a reshape and a reverse)."""
    axis = axis % x.shape.rank
    width = x.shape[axis]
    pair_shape, pair_axis = _pair_axes(layout, width)
    shape = tf.shape(x)
    paired = tf.reshape(x, tf.concat([shape[:axis], pair_shape, shape[axis + 1 :]], 0))
    return tf.reshape(tf.reverse(paired, [axis + pair_axis]), shape)


def rotation_table(rotary_dim: int, max_wavelength: float, layout: str) -> PositionTable:
    """The shared `PositionTable` whose rows are RoPE's `(C, S)` for `rotary_dim` channels."""
    return position_table(
        ("rotary", rotary_dim, max_wavelength, layout),
        lambda: PositionTable(
            FrequencyTable(inverse_frequencies(rotary_dim, max_wavelength)),
            lambda sin, cos: _rotation_tables(layout, sin, cos),
        ),
    )


@keras.saving.register_keras_serializable(package="keras_posenc")
class RotaryEmbedding(keras.layers.Layer):
    """Rotary position embedding (RoPE): rotates channel pairs by `position·ω_k`.

    Apply it to queries and keys (after projection, before the dot product); their
    dot product then depends on the relative position only. `ω_k =
    max_wavelength^(-2k/rotary_dim)`. The sin/cos tables are exact float32 roundings at
    every position below 2^24, whatever the dtype policy; only the result is cast.

    Example:

    >>> rope = RotaryEmbedding()
    >>> queries = np.random.uniform(-1, 1, size=(2, 10, 4, 32)).astype("float32")
    >>> tuple(rope(queries).shape)
    (2, 10, 4, 32)

    Args:
        max_wavelength: the base of the frequencies (10000 in RoFormer, 500000 in Llama 3).
        layout: `"half"` pairs channel `k` with `k + D/2` (GPT-NeoX, Llama in
            transformers; ONNX `interleaved=0`); `"interleaved"` pairs `2k` with `2k+1`
            (GPT-J, the RoFormer paper; ONNX `interleaved=1`).
        rotary_dim: rotate only the first `rotary_dim` channels (even) and pass the rest
            through unchanged; default all.
        sequence_axis: the axis of the positions in the input.
        feature_axis: the axis of the channels in the input.
        **kwargs: base layer arguments (`name`, `dtype`, ...).

    Call arguments:
        inputs: float tensor, `(batch, sequence, heads, head_dim)` or `(batch, sequence, dim)`
            (with the default axes).
        positions: optional integer tensor `(sequence,)` or `(batch, sequence)`.
        start_index: the position of the first step when `positions` is not given: a Python
            int or a scalar int tensor (decoding with a cache).

    Input shape: rank 3 or 4. Output shape: the same. A Keras mask passes through.
    """

    def __init__(
        self,
        max_wavelength: float = 10000.0,
        layout: str = "half",
        rotary_dim: int | None = None,
        sequence_axis: int = 1,
        feature_axis: int = -1,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.max_wavelength = checked_max_wavelength(max_wavelength)
        self.layout = checked_choice("layout", layout, LAYOUTS)
        self.rotary_dim = (
            None if rotary_dim is None else checked_even_width(rotary_dim, "rotary_dim")
        )
        self.sequence_axis = int(sequence_axis)
        self.feature_axis = int(feature_axis)
        self.supports_masking = True

    def build(self, input_shape) -> None:
        rank = len(input_shape)
        if rank not in (3, 4):
            raise ValueError(
                "RotaryEmbedding expects inputs of rank 3 (batch, sequence, dim) or 4 "
                f"(batch, sequence, heads, head_dim), got shape {tuple(input_shape)}."
            )
        for name in ("sequence_axis", "feature_axis"):
            if not -rank <= getattr(self, name) < rank:
                raise ValueError(
                    f"{name}={getattr(self, name)} does not fit inputs of rank {rank} "
                    f"(shape {tuple(input_shape)})."
                )
        self._sequence_axis = self.sequence_axis % rank
        self._feature_axis = self.feature_axis % rank
        if not 0 < self._sequence_axis < self._feature_axis:
            raise ValueError(
                f"sequence_axis={self.sequence_axis} and feature_axis={self.feature_axis} must "
                "be axes after the batch axis 0, the sequence axis before the feature axis "
                "(for example (batch, sequence, heads, head_dim) or (batch, heads, sequence, "
                "head_dim))."
            )
        head_dim = input_shape[self._feature_axis]
        if head_dim is None:
            raise ValueError("RotaryEmbedding needs the size of the feature axis to be known.")
        rotary_dim = self.rotary_dim or checked_even_width(head_dim, "the feature axis size")
        if rotary_dim > head_dim:
            raise ValueError(
                f"rotary_dim={rotary_dim} is larger than the feature axis ({head_dim}); "
                f"use rotary_dim <= {head_dim}."
            )
        self._rotary_dim = rotary_dim
        self._table = rotation_table(rotary_dim, self.max_wavelength, self.layout)
        super().build(input_shape)

    def call(self, inputs, positions=None, start_index=0):
        rank = inputs.shape.rank
        cos_table, sin_table = position_rows(
            self._table,
            static_dim(inputs, self._sequence_axis),
            positions,
            start_index,
            limit=MAX_POSITIONS,
            limit_hint="the rotation is exact only below that.",
        )
        # Tables are (sequence, rotary_dim) or (batch, sequence, rotary_dim): give them
        # size-1 axes so they broadcast against the input's axes.
        table_axes = [0, self._sequence_axis, self._feature_axis][-cos_table.shape.rank :]
        broadcast_shape = [1] * rank
        for table_axis, input_axis in enumerate(table_axes):
            broadcast_shape[input_axis] = static_dim(cos_table, table_axis)
        cos_table = tf.cast(tf.reshape(cos_table, broadcast_shape), inputs.dtype)
        sin_table = tf.cast(tf.reshape(sin_table, broadcast_shape), inputs.dtype)

        head_dim = inputs.shape[self._feature_axis]
        if self._rotary_dim == head_dim:
            return (
                inputs * cos_table + swap_pairs(inputs, self.layout, self._feature_axis) * sin_table
            )
        rotated, passed = tf.split(
            inputs, [self._rotary_dim, head_dim - self._rotary_dim], self._feature_axis
        )
        rotated = (
            rotated * cos_table + swap_pairs(rotated, self.layout, self._feature_axis) * sin_table
        )
        return tf.concat([rotated, passed], self._feature_axis)

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self) -> dict:
        config = super().get_config()
        config.update(
            {
                "max_wavelength": self.max_wavelength,
                "layout": self.layout,
                "rotary_dim": self.rotary_dim,
                "sequence_axis": self.sequence_axis,
                "feature_axis": self.feature_axis,
            }
        )
        return config
