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

from keras_posenc.dynamic_ntk import fixed_point_turns

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


def dynamic_words(narrow: Callable, wide: Callable, scaled, unscaled: tuple) -> tuple:
    """Dynamic NTK's frequency words for a total length known at run time: two `(width,)`
    float32 tensors, by float32 arithmetic (`narrow()`) or float64 (`wide()`), whichever
    the graph being traced runs fastest and can hold.

    - A plain graph (`tf.function`, a SavedModel) runs each op as its own kernel, on a CPU
      or a GPU, both of which have float64: `wide()` is a dozen ops where `narrow()`'s
      error-free float32 arithmetic is a few hundred, each a kernel launch.
    - Under XLA (TPUs have no float64) `narrow()` fuses into a few kernels, inside a
      conditional on the run-time predicate `scaled` (past `max_position_embeddings`),
      whose other branch is the host words `unscaled`: the conditional keeps the
      arithmetic apart from the rows' fused kernels (XLA would copy it into each, and
      compiling those takes minutes for a few hundred positions).
    - Eagerly, and in graphs traced for a converter (whose files then hold no control
      flow, and LiteRT no float64 `Exp` / `Log`), plain `narrow()`.
    """
    from keras_posenc._tf.tracing import assertions_dropped, in_xla_context

    if tf.executing_eagerly() or (assertions_dropped() and not in_xla_context()):
        return narrow()
    if not in_xla_context():
        return wide()
    words = tuple(tf.constant(word) for word in unscaled)
    return tuple(tf.cond(scaled, lambda: tuple(narrow()), lambda: words))


_TURN = 2**32  # one turn in the fixed-point product below: int32 arithmetic wraps at it


def exact_sin_cos(positions: tf.Tensor, turns: tuple) -> tuple[tf.Tensor, tf.Tensor]:
    """`(sin, cos)` of `2π · positions · turns` for `turns` known only at run time.

    For frequencies made inside the graph (dynamic NTK scaling), where no host table can
    exist. `turns` is the frequency in turns per position (`ω / 2π`) as two float32
    words `(hi, lo)`, below 1 (`keras_posenc.dynamic_ntk`). The angle is a count of 2^-32
    turns: the product of the position with the frequency's whole count of them, in int32
    arithmetic, which wraps modulo 2^32 (a turn: what wraps is whole turns) and which no
    graph optimizer can reorder, plus the product with the frequency's fraction of one,
    below 2^25 and rounded to a whole count (within 3 · 2^-32 turns). The other roundings
    are of the final angle in `[-π, π)` and of sin/cos: about 3e-7 at any position below
    2^24. Each element takes two products, a rounding and an integer sum before them.

    Args:
        positions: integer tensor, any shape, values in `[0, 2^24)`.
        turns: float32 tensors `(hi, lo)`, each `(dim/2,)`.

    Returns:
        float32 `(sin, cos)`, each of shape `positions.shape + (dim/2,)`.
    """
    whole, rest = fixed_point_turns(
        *(tf.cast(t, tf.float32) for t in turns), tf.round, lambda x: tf.cast(x, tf.int32)
    )
    # expand_dims, not [..., None]: tf2onnx needs ranks for the latter, and inside a
    # conditional's branch it does not know them.
    positions = tf.expand_dims(tf.cast(positions, tf.int32), -1)
    fraction = tf.round(tf.cast(positions, tf.float32) * rest)  # |.| < 2^25: exact in int32
    fixed = positions * whole + tf.cast(fraction, tf.int32)  # modulo 2^32: a whole turn
    angle = tf.cast(fixed, tf.float32) * np.float32(2.0 * np.pi / _TURN)
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
