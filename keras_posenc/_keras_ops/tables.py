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

_TURN = 2**31  # one turn, as in `keras_posenc._tf.exact_sin_cos`


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


def apart(compute: Callable, scaled, unscaled: tuple) -> tuple:
    """`_tf.apart` here: under `jax.jit` (a traced `scaled`) a `jax.lax.cond` between
    `compute()` and the host words `unscaled`, which also keeps `compute` out of the
    fused kernels of the rows; elsewhere plain `compute()`."""
    if keras.backend.backend() != "jax" or not is_traced(scaled):
        return compute()
    import jax

    words = tuple(ops.convert_to_tensor(word) for word in unscaled)
    return tuple(jax.lax.cond(scaled, lambda: tuple(compute()), lambda: words))


def _words(high, low):
    """`_tf.tables._fixed_point_words` here (the same grid roundings)."""
    w1 = ops.round(high * 4096.0) * (1.0 / 4096.0)
    rest = high - w1
    w2 = ops.round(rest * 2.0**24) * 2.0**-24
    rest = (rest - w2) + low
    w3 = ops.round(rest * 2.0**36) * 2.0**-36
    return w1, w2, w3, rest - w3


def exact_sin_cos(positions, turns: tuple):
    """`_tf.exact_sin_cos` here: the same fixed-point sum, so the same angles.

    JAX has no int64 by default: its sum is int32, which wraps modulo 2^32; a turn being
    2^31, the wrapped sum reduces to the same fraction of a turn (a bit mask, not floormod).
    """
    wide = "int64" if keras.backend.backend() == "torch" else "int32"
    words = _words(*(ops.cast(t, "float32") for t in turns))
    positions = ops.expand_dims(ops.cast(positions, "int32"), -1)
    position_low = positions % 4096
    position_high = ops.cast(positions - position_low, "float32")
    position_low = ops.cast(position_low, "float32")
    # Exact products; position_high · w1 is left out: a multiple of 4096 times a multiple
    # of 2^-12 is a whole number of turns.
    products = [position_low * words[0]]
    products += [p * w for p in (position_high, position_low) for w in words[1:3]]
    products.append((position_high + position_low) * words[3])  # below 2^-13: rounded once
    fixed = ops.zeros((), wide)
    for product in products:
        fraction = product - ops.round(product)
        fixed = fixed + ops.cast(ops.round(fraction * float(_TURN)), wide)
    half = _TURN // 2
    wrapped = ops.bitwise_and(fixed + half, _TURN - 1) - half
    angle = ops.cast(wrapped, "float32") * np.float32(2.0 * np.pi / _TURN)
    return ops.sin(angle), ops.cos(angle)


# --------------------------------------------------------------------------------------
# The layouts of the rows (`keras_posenc.layouts` in `keras.ops`)


def encoding(layout: str, sin, cos, axes: int = 1):
    return layouts.encoding(layout, sin, cos, axes, ops)


def channel_tables(layout: str, sin, cos) -> tuple:
    return layouts.channel_tables(layout, sin, cos, ops)
