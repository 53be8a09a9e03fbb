"""What the encoder layers' rows need of JAX and PyTorch: `keras_posenc.backend.tensorflow.rows`'
names.

A start or positions known now are checked now, with TensorFlow's messages; traced ones
(`jax.jit`, or torch's meta tensors while Keras infers shapes) are clamped into the tables
and the rows poisoned with NaN when they are bad, as under XLA in TensorFlow. Eager calls
read the host tables as tensors made once per table (`HostConstant`); traced ones embed
the rows they use as constants. Under `jax.jit` XLA compiles everything: a run-time choice
of rows is a conditional (`keras.ops.cond`), and what follows it runs inside its branches.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import keras
import numpy as np
from keras import ops

from keras_posenc.backend.keras_ops.values import static_value

# Runs of at most this many row values take both sources and a `where` instead of a
# conditional (`python -m benchmarks --backend jax`: the 1x16x64 cases, tensor start).
SMALL_RUN_VALUES = 4096

# --------------------------------------------------------------------------------------
# Checks and poison: nothing asserts here, a traced value's verdict poisons the rows


def check(predicate, values: list, message, error=ValueError):
    """`True` after raising `error(message(...))` unless `predicate` holds, where every value
    is known now; else the bool tensor of `predicate` (the verdict the rows are poisoned by)."""
    values_now = [static_value(v) for v in values]
    if all(v is not None for v in values_now):
        if not np.all(predicate(*values_now)):
            raise error(message(*(np.asarray(v).tolist() for v in values_now)))
        return True
    return ops.all(predicate(*values))


def _conjunction(verdicts: Sequence):
    from keras_posenc.tables.positions import both

    valid = True
    for verdict in verdicts:
        valid = both(valid, verdict)
    return valid


def validity(verdicts: Sequence, condition: Callable):
    """What the rows are poisoned by: the verdicts themselves (`condition`, which graphs
    that assert form again, is not needed)."""
    del condition
    return _conjunction(verdicts)


def clamped_positions(positions, limit: int, verdicts: Sequence):
    """`(positions clamped into [0, limit), valid)`: `valid` the verdicts' conjunction.
    Known positions are clamped too (under `jax.jit` a constant's clamp is traced)."""
    valid = _conjunction(verdicts)
    return ops.clip(positions, 0, limit - 1), valid


def nan_unless(rows, valid) -> tuple:
    """`rows`, NaN in place of them where `valid` (a traced bool) is False."""
    if valid is True:
        return tuple(rows)
    return tuple(ops.where(valid, row, ops.cast(float("nan"), row.dtype)) for row in rows)


def _int32_saturated(x):
    """Integers as int32, clipped (2^32 + 5 must stay out of range, not become 5)."""
    dtype = keras.backend.standardize_dtype(x.dtype)
    bounds = np.iinfo(np.int32)
    if dtype in ("uint32", "uint64"):
        # Only the top to clip: a negative bound would wrap in the unsigned dtype.
        x = ops.minimum(x, np.array(bounds.max, dtype))
    elif dtype == "int64":
        x = ops.clip(x, int(bounds.min), int(bounds.max))
    return ops.cast(x, "int32")


def as_int32_positions(x):
    """Integers as int32, saturated (as `tf_backend.as_int32_positions`)."""
    return _int32_saturated(ops.convert_to_tensor(x))


def as_positions(positions):
    """`positions` as a host array when known now (checked on the host: under `jax.jit` a
    computation on a constant is traced, its value unknown), else a tensor; integers of
    another width as int32, saturated, so that the checks compare in int32 (in uint8 the
    limit 2^24 would wrap to 0)."""
    values = static_value(positions)
    if values is not None:
        return np.asarray(values)
    positions = ops.convert_to_tensor(positions)
    dtype = keras.backend.standardize_dtype(positions.dtype)
    if "int" in dtype and dtype != "int32":
        return _int32_saturated(positions)
    return positions


# --------------------------------------------------------------------------------------
# Rows of a table, and run-time choices


def slice_rows(table, start, length):
    """Rows `start .. start + length - 1` of `table`; `start` an int or a traced int32."""
    if isinstance(start, (int, np.integer)) and isinstance(length, (int, np.integer)):
        # Python's slice: an eager call then pays no `keras.ops` dispatch.
        return table[start : start + length]
    return ops.slice(table, (start, 0), (length, table.shape[1]))


def smallest(x):
    return ops.min(x)


def largest(x):
    return ops.max(x)


def choose_at_run_time(predicate, if_true, if_false, combine: Callable, unknown: Callable):
    """`combine(*if_true())` where `predicate` holds at run time, else `combine(*if_false())`.

    Few rows (`SMALL_RUN_VALUES`): both sources and a `where`, which cost less than a
    conditional under XLA (the sizes are read from the rows of `if_true`, slices whose
    trace is dropped when unused). Otherwise `keras.ops.cond` with `combine` inside each
    branch, so that XLA fuses the row lookup into it instead of writing the rows out (as
    `tf_backend.choose_at_run_time` under XLA). The computed rows must not fuse into `combine`:
    XLA would compute them again for every batch row and head. A conditional is a fusion
    boundary (XLA:CPU drops an optimization barrier before fusing), so they come out of
    one (on `unknown()`, any bool XLA cannot fold).
    """
    rows = if_true()
    if sum(math.prod(row.shape) for row in rows) <= SMALL_RUN_VALUES:
        chosen = zip(rows, if_false(), strict=True)
        return combine(*(ops.where(predicate, a, b) for a, b in chosen))

    def computed_once():
        return ops.cond(unknown(), if_false, if_false)

    return ops.cond(predicate, lambda: combine(*if_true()), lambda: combine(*computed_once()))


def combined(rows: Callable, combine: Callable):
    """`rows(combine)`: a choice of table by the total length (`SwitchByLength`) runs
    `combine` inside its branches, as every run-time choice here."""
    return rows(combine)


# --------------------------------------------------------------------------------------
# What TensorFlow's graphs need and these backends do not: the same names, doing nothing


def after(verdicts: Sequence, tensor):
    """`tensor` itself: there are no assertions to wait for."""
    return tensor


def int_array(values):
    """`values` (TensorFlow's eager ops want int32 arrays)."""
    return values


# --------------------------------------------------------------------------------------
# Ops `tensorflow` gives its own where `keras.ops` would change TensorFlow's exported graphs


def read(table):
    """A variable's value as one tensor."""
    return ops.convert_to_tensor(table)


def cond(predicate, if_true: Callable, if_false: Callable):
    return ops.cond(predicate, if_true, if_false)


def equal(x, y):
    return ops.equal(x, y)


def maximum(x, y):
    """The larger of `x` and `y`: a Python number for two (no traced op on constants)."""
    if isinstance(x, (int, np.integer)) and isinstance(y, (int, np.integer)):
        return max(x, y)
    return ops.maximum(x, y)


def total_length_of_run(start, length, positions):
    """The total length of the run `positions`: its largest position + 1 (as these
    backends have always formed it; TensorFlow: `start + length`, the same value)."""
    return ops.max(positions) + 1
