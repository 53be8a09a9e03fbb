"""The values of the encoder layers' rows in TensorFlow's graphs: what they are made of.

The split tables' lookup of any position, the fixed-point rotation of frequencies known
only at run time (dynamic NTK, `keras_posenc.dynamic_ntk`), and the layouts of the rows,
in ops shaped for the converters.
Re-exported by `keras_posenc._tf`; `keras_posenc._keras_ops.tables` has the same names.
"""

from __future__ import annotations

import functools
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


def _fixed_point_words(high, low, round_):
    """`high + low` (a frequency in turns, below 1) as `w1 + w2 + w3 + w4`: `w1`, `w2`, `w3`
    multiples of 2^-12, 2^-24, 2^-36 with at most 12 significant bits each (so their
    products with 12-bit parts of a position are exact), `w4` below 2^-37.

    Roundings to a grid and differences of neighbours: exact, with no product an FMA
    could change (a Veltkamp split is not, once XLA contracts `x·4097 - x`).
    """
    w1 = round_(high * 4096.0) * (1.0 / 4096.0)
    rest = high - w1  # exact
    w2 = round_(rest * 2.0**24) * 2.0**-24
    rest = (rest - w2) + low  # below 2^-24: the sum rounds at 2^-48
    w3 = round_(rest * 2.0**36) * 2.0**-36
    return w1, w2, w3, rest - w3


def apart(compute: Callable, scaled, unscaled: tuple) -> tuple:
    """`compute()` (two `(width,)` tensors) where the run-time predicate `scaled` holds,
    else the host words `unscaled`; in a graph, a conditional between the two.

    Dynamic NTK's frequency arithmetic (`compute`) is a few hundred small ops. Past
    `max_position_embeddings` only does it change the frequencies: at or below, the
    conditional takes the host's unscaled words and runs none of them (the common decode
    case), in plain graphs and under XLA alike. Under XLA the conditional also keeps the
    arithmetic apart from the rows' fused kernels (XLA would copy it into each, and
    compiling those takes minutes for a few hundred positions). Eagerly, and in graphs
    traced for a converter (whose files then hold no control flow), plain `compute()`.
    """
    from keras_posenc._tf.tracing import assertions_dropped, in_xla_context

    if tf.executing_eagerly() or (assertions_dropped() and not in_xla_context()):
        return compute()
    words = tuple(tf.constant(word) for word in unscaled)
    return tuple(tf.cond(scaled, lambda: tuple(compute()), lambda: words))


_TURN = 2**31  # one turn in the fixed-point sum below


def exact_sin_cos(positions: tf.Tensor, turns: tuple) -> tuple[tf.Tensor, tf.Tensor]:
    """`(sin, cos)` of `2π · positions · turns` for `turns` known only at run time.

    For frequencies made inside the graph (dynamic NTK scaling), where no host table can
    exist. `turns` is the frequency in turns per position (`ω / 2π`) as two float32
    words `(hi, lo)`, below 1 (`keras_posenc.dynamic_ntk`). The product `position · turns`
    is six exact float32 products of 12-bit parts (`_fixed_point_words`) and one below
    2^-13 of a turn, rounded once; each is reduced to a fraction of a turn and added in
    64-bit fixed point (integer arithmetic, which no graph optimizer can reorder). The
    other roundings are of the final angle in `[-π, π)` and of sin/cos: about 3e-7 at any
    position below 2^24.

    Args:
        positions: integer tensor, any shape, values in `[0, 2^24)`.
        turns: float32 tensors `(hi, lo)`, each `(dim/2,)`.

    Returns:
        float32 `(sin, cos)`, each of shape `positions.shape + (dim/2,)`.
    """
    words = _fixed_point_words(*(tf.cast(t, tf.float32) for t in turns), tf.round)
    # expand_dims, not [..., None]: tf2onnx needs ranks for the latter, and inside a
    # conditional's branch it does not know them.
    positions = tf.expand_dims(tf.cast(positions, tf.int32), -1)
    position_low = positions % 4096
    position_high = tf.cast(positions - position_low, tf.float32)  # 12 significant bits
    position_low = tf.cast(position_low, tf.float32)
    # Exact products; position_high · w1 is left out: a multiple of 4096 times a multiple
    # of 2^-12 is a whole number of turns.
    products = [position_low * words[0]]
    products += [p * w for p in (position_high, position_low) for w in words[1:3]]
    products.append((position_high + position_low) * words[3])  # below 2^-13: rounded once
    fixed = tf.zeros([], tf.int64)
    for product in products:
        fraction = product - tf.round(product)  # exact, in [-0.5, 0.5]
        fixed += tf.cast(tf.round(fraction * _TURN), tf.int64)
    half = _TURN // 2
    wrapped = tf.math.floormod(fixed + half, _TURN) - half  # [-half turn, half turn)
    angle = tf.cast(wrapped, tf.float32) * np.float32(2.0 * np.pi / _TURN)
    return tf.sin(angle), tf.cos(angle)


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
