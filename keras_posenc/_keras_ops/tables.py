"""The values of the encoder layers' rows on JAX and PyTorch: `keras_posenc._tf.tables`' names.

The same operands and arithmetic as TensorFlow's graphs (so the same numbers: the split
tables' products, the fixed-point sum of `exact_sin_cos`), in `keras.ops`; a run from a
traced start reads the split tables by slices, which XLA:CPU runs far faster than gathers.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable

import keras
import numpy as np
from keras import ops

from keras_posenc import layouts
from keras_posenc._host_constant import HostConstant
from keras_posenc._keras_ops.values import is_traced
from keras_posenc.dynamic_ntk import fixed_point_turns

_TURN = 2**32  # one turn, as in `keras_posenc._tf.exact_sin_cos`


def one_call_eagerly(function: Callable) -> Callable:
    """`function` (TensorFlow makes it one `tf.function` eagerly)."""
    return function


# --------------------------------------------------------------------------------------
# Rows of the split tables, and of frequencies made in the graph


# Per frequency table, the host tables `_run_by_slices` slices: the fine rows twice over (a
# run's fine rows then never wrap) and the coarse rows with one more (the next coarse row
# of the last one is never used, but must exist for a slice of two).
_run_tables: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def run_sin_cos(frequencies, start, length, top: int, below: int | None):
    """`frequencies.sin_cos` of the run `start .. start + length - 1`, clamped below `top`.

    For a traced `start` and `length <= CACHED_POSITIONS`, by slices: the same operands
    and arithmetic (so the same values), without gathers, which XLA:CPU runs far slower
    than slices. Otherwise the gathers of `sin_cos`.
    """
    from keras_posenc.frequencies import CACHED_POSITIONS
    from keras_posenc.rows import clamped_run

    if isinstance(start, (int, np.integer)) or length > CACHED_POSITIONS:
        return frequencies.sin_cos(clamped_run(start, length, top), below=below)
    return _run_by_slices(frequencies, start, length)


def _run_by_slices(frequencies, start, length: int):
    """`start` is clamped into the tables; the caller poisons the rows of a bad run."""
    from keras_posenc.frequencies import CACHED_POSITIONS, MAX_POSITIONS

    if frequencies not in _run_tables:
        fine_sin, fine_cos, coarse_sin, coarse_cos = (
            table.array for table in frequencies._split_tables
        )
        _run_tables[frequencies] = tuple(
            HostConstant(array)
            for array in (
                np.concatenate([fine_sin, fine_sin]),
                np.concatenate([fine_cos, fine_cos]),
                np.concatenate([coarse_sin, coarse_sin[-1:]]),
                np.concatenate([coarse_cos, coarse_cos[-1:]]),
            )
        )
    # Eagerly (a PyTorch tensor start) tensors made once, not a copy of the tables a call.
    traced = is_traced(start)
    tables = (table.tensor(traced) for table in _run_tables[frequencies])
    fine_sin, fine_cos, coarse_sin, coarse_cos = tables
    width = fine_sin.shape[1]
    start = ops.clip(start, 0, MAX_POSITIONS - length)
    coarse = start // CACHED_POSITIONS
    fine = start - coarse * CACHED_POSITIONS
    sin_b = ops.slice(fine_sin, (fine, 0), (length, width))
    cos_b = ops.slice(fine_cos, (fine, 0), (length, width))
    # Rows past the end of the fine rows take the next coarse row.
    carried = ops.expand_dims(ops.arange(length, dtype="int32") >= CACHED_POSITIONS - fine, -1)
    two_sin = ops.slice(coarse_sin, (coarse, 0), (2, width))
    two_cos = ops.slice(coarse_cos, (coarse, 0), (2, width))
    sin_a = ops.where(carried, two_sin[1:], two_sin[:1])
    cos_a = ops.where(carried, two_cos[1:], two_cos[:1])
    return sin_a * cos_b + cos_a * sin_b, cos_a * cos_b - sin_a * sin_b


def dynamic_words(narrow: Callable, wide: Callable, scaled, unscaled: tuple) -> tuple:
    """`_tf.dynamic_words` here: under `jax.jit` (a traced `scaled`) a `jax.lax.cond`
    between `narrow()` and the host words `unscaled`, which also keeps `narrow` out of the
    fused kernels of the rows; elsewhere plain `narrow()` (`wide`, float64, is for
    TensorFlow's plain graphs)."""
    del wide
    if keras.backend.backend() != "jax" or not is_traced(scaled):
        return narrow()
    import jax

    words = tuple(ops.convert_to_tensor(word) for word in unscaled)
    return tuple(jax.lax.cond(scaled, lambda: tuple(narrow()), lambda: words))


def exact_sin_cos(positions, turns: tuple):
    """`_tf.exact_sin_cos` here: the same int32 fixed-point product, so the same angles
    (int32 arithmetic wraps modulo 2^32, a turn, on every backend)."""
    whole, rest = fixed_point_turns(
        *(ops.cast(t, "float32") for t in turns), ops.round, lambda x: ops.cast(x, "int32")
    )
    positions = ops.expand_dims(ops.cast(positions, "int32"), -1)
    fraction = ops.round(ops.cast(positions, "float32") * rest)
    fixed = positions * whole + ops.cast(fraction, "int32")
    angle = ops.cast(fixed, "float32") * np.float32(2.0 * np.pi / _TURN)
    return ops.sin(angle), ops.cos(angle)


# --------------------------------------------------------------------------------------
# The layouts of the rows (`keras_posenc.layouts` in `keras.ops`)


def encoding(layout: str, sin, cos, axes: int = 1):
    return layouts.encoding(layout, sin, cos, axes, ops)


def channel_tables(layout: str, sin, cos) -> tuple:
    return layouts.channel_tables(layout, sin, cos, ops)
