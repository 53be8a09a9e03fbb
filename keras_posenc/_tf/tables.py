"""The values of the encoder layers' rows in TensorFlow's graphs: what they are made of.

The split tables' lookup of any position, the fixed-point rotation of frequencies made in
the graph (dynamic NTK), and the layouts of the rows, in ops shaped for the converters.
Re-exported by `keras_posenc._tf`; `keras_posenc._keras_ops.tables` has the same names.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import numpy as np
import tensorflow as tf

# --------------------------------------------------------------------------------------
# Rows of the split tables, and of frequencies made in the graph


def one_call_eagerly(function: Callable) -> Callable:
    """`function`, or eagerly one `tf.function` of it: one call instead of eight ops. In a
    graph the ops themselves (inline): a nested function call hides the rows' shapes from
    converters (the TFLite converter then sees an unranked tensor and needs a Flex op for
    the einsum after it)."""
    if tf.executing_eagerly():
        return _eager_function(function)
    return function


@functools.cache
def _eager_function(function: Callable) -> Callable:
    return tf.function(function, autograph=False, reduce_retracing=True)


def run_sin_cos(frequencies, start, length, top: int, below: int | None):
    """`frequencies.sin_cos` of the run `start .. start + length - 1`, clamped below `top`:
    gathers from the split tables (their rows below `below`)."""
    from keras_posenc.rows import clamped_run

    return frequencies.sin_cos(clamped_run(start, length, top), below=below)


def _split(x: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    # Veltkamp: x = high + low with 12 significant bits each, so the product of any two
    # halves is exact in float32 (no rounding, and no change if fused into an FMA).
    scaled = x * 4097.0
    high = scaled - (scaled - x)
    return high, x - high


_TURN = 2**31  # one turn in the fixed-point sum below


def exact_sin_cos(positions: tf.Tensor, turns: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """`(sin, cos)` of `2π · positions · turns` for float32 `turns` known only at run time.

    For frequencies made inside the graph (dynamic NTK scaling), where no host table can
    exist. `turns` is the frequency in turns per position (`ω / 2π`). The product
    `position · turns` is never rounded: it is the sum of four exact float32 products of
    12-bit halves, each reduced to a fraction of a turn and added in 64-bit fixed point
    (integer arithmetic, which no graph optimizer can reorder). The only roundings are of
    the final angle in `[-π, π)` and of sin/cos: about 3e-7 at any position below 2^24.

    Args:
        positions: integer tensor, any shape, values in `[0, 2^24)`.
        turns: float32 tensor `(dim/2,)`.

    Returns:
        float32 `(sin, cos)`, each of shape `positions.shape + (dim/2,)`.
    """
    turns_high, turns_low = _split(tf.cast(turns, tf.float32))
    # expand_dims, not [..., None]: tf2onnx needs ranks for the latter, and inside a
    # conditional's branch it does not know them.
    positions = tf.expand_dims(tf.cast(positions, tf.int32), -1)
    position_low = positions % 4096
    position_high = tf.cast(positions - position_low, tf.float32)  # 12 significant bits
    position_low = tf.cast(position_low, tf.float32)
    fixed = tf.zeros([], tf.int64)
    for position_part in (position_high, position_low):
        for turns_part in (turns_high, turns_low):
            product = position_part * turns_part  # exact
            fraction = product - tf.round(product)  # exact, in [-0.5, 0.5]
            fixed += tf.cast(tf.round(fraction * _TURN), tf.int64)
    half = _TURN // 2
    wrapped = tf.math.floormod(fixed + half, _TURN) - half  # [-half turn, half turn)
    angle = tf.cast(wrapped, tf.float32) * np.float32(2.0 * np.pi / _TURN)
    return tf.sin(angle), tf.cos(angle)


def dynamic_turns(
    total_length, omega: np.ndarray, factor: float, max_position_embeddings: int
) -> tf.Tensor:
    """Dynamic NTK frequencies in turns per position (`ω'/2π`), float32, for a run-time length.

    `ω'_k = ω_k · g^(-2k/(d-2))` with `g = factor·L/M - (factor - 1)` and `L` the total
    length, at least `M`: the same as raising the base by `g^(d/(d-2))`, written so that
    only the small correction `g^(-e)` is formed in float32 (relative error about 2e-7).
    """
    dim = 2 * len(omega)
    exponents = np.arange(0, dim, 2, dtype=np.float64) / (dim - 2)
    length = tf.maximum(tf.cast(total_length, tf.float32), float(max_position_embeddings))
    growth = factor * length / float(max_position_embeddings) - (factor - 1.0)
    correction = tf.exp(-exponents.astype(np.float32) * tf.math.log(growth))
    return (omega / (2 * math.pi)).astype(np.float32) * correction


# --------------------------------------------------------------------------------------
# The layouts of the rows, in the graph (the host tables: `keras_posenc.layouts`)


def _interleave(a: tf.Tensor, b: tf.Tensor) -> tf.Tensor:
    # [a0, b0, a1, b1, ...]: neighbours share a frequency. A non-negative stacking axis:
    # tf2onnx resolves a negative one from the rank, which it does not know inside a
    # conditional's branch.
    pairs = tf.stack([a, b], axis=a.shape.rank)
    return tf.reshape(pairs, tf.concat([tf.shape(a)[:-1], [2 * a.shape[-1]]], 0))


def _concat(a: tf.Tensor, b: tf.Tensor) -> tf.Tensor:
    return tf.concat([a, b], axis=-1)


def encoding(layout: str, sin: tf.Tensor, cos: tf.Tensor, axes: int = 1) -> tf.Tensor:
    """`keras_posenc.layouts.encoding` in TensorFlow's ops, shaped for the converters."""
    lay_out = _interleave if layout == "interleaved" else _concat
    if axes == 1:
        return lay_out(sin, cos)
    blocks = zip(tf.split(sin, axes, -1), tf.split(cos, axes, -1), strict=True)
    return tf.concat([lay_out(s, c) for s, c in blocks], -1)


def channel_tables(layout: str, sin: tf.Tensor, cos: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """`keras_posenc.layouts.channel_tables` in TensorFlow's ops: RoPE's `(C, S)`."""
    # A non-negative stacking axis: tf2onnx resolves a negative one from the rank, which
    # it does not know inside a conditional's branch.
    pair_axis = sin.shape.rank - 1 if layout == "half" else sin.shape.rank
    shape = tf.concat([tf.shape(sin)[:-1], [2 * sin.shape[-1]]], 0)
    cos_table = tf.reshape(tf.stack([cos, cos], axis=pair_axis), shape)
    sin_table = tf.reshape(tf.stack([-sin, sin], axis=pair_axis), shape)
    return cos_table, sin_table
