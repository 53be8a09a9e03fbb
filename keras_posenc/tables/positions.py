"""Which positions a call covers, checked: a run from `start_index`, or explicit `positions`.

Every layer takes the same `positions=None, start_index=0` pair and asks a table for the
rows of those positions: `table.slice(start, length, combine)` for a run,
`table.gather(positions)` otherwise, and `combine`s them with its input. One
implementation serves every backend; what differs is asked of `tricks()`.

Checks raise at once when the values are known (eagerly, static while tracing, a host
array); otherwise they are graph assertions on TensorFlow. XLA compiles assertions away,
converters (tf2onnx, the TFLite converter) drop them, and JAX has none, so wherever
nothing can raise the rows of positions that fail the checks become NaN: under
`jit_compile=True` or `jax.jit`, in a SavedModel, ONNX or LiteRT file a bad position gives
NaN, never a plausible wrong answer.
"""

from __future__ import annotations

from typing import Protocol

import keras
import numpy as np
from keras import ops

from keras_posenc.backend.lazy import tricks
from keras_posenc.layers.checks import rank_of
from keras_posenc.tables.rows import as_rows


class RowTable(Protocol):
    def slice(self, start, length, combine, traced=None): ...

    def gather(self, positions) -> tuple: ...


def static_dim(x, axis: int):
    """`x.shape[axis]` when known while tracing (JAX: an int or a symbolic size), else the
    run-time size."""
    size = x.shape[axis]
    return tricks().run_time_size(x, axis) if size is None else size


def _dtype(x) -> str:
    return keras.backend.standardize_dtype(x.dtype)


def _cast(name: str) -> str:
    """How to cast `name` to int32, in the user's backend's words."""
    op = "tf.cast" if keras.backend.backend() == "tensorflow" else "keras.ops.cast"
    return f"{op}({name}, 'int32')"


def _is_int(value) -> bool:
    return isinstance(value, (int, np.integer))


def both(a, b):
    """The conjunction of two validities (`True` or bool tensors)."""
    if a is True:
        return b
    return a if b is True else a & b


def checked_start_index(start_index):
    """`start_index` as a Python int or a scalar int32 tensor, >= 0."""
    start = _start_index(start_index)
    verdict = tricks().check(
        lambda s: s >= 0,
        [start],
        lambda s: f"start_index must be >= 0, got {s}. Positions count from 0.",
    )
    return tricks().after([verdict], start)


def _start_index(start_index):
    """`start_index` as a Python int or a scalar int32 tensor; its sign is checked by callers."""
    if isinstance(start_index, (bool, np.bool_)):
        raise TypeError(f"start_index must be an integer, got the bool {start_index!r}.")
    if _is_int(start_index):
        return int(start_index)
    start_index = ops.convert_to_tensor(start_index)
    if "int" not in _dtype(start_index):
        raise TypeError(
            f"start_index must be an int32 or int64 scalar, got dtype {_dtype(start_index)}. "
            f"Cast it with {_cast('start_index')}."
        )
    if rank_of(start_index) not in (None, 0):
        raise ValueError(
            f"start_index must be a scalar, got shape {tuple(start_index.shape)}. "
            "For a different start per sequence, pass `positions` of shape (batch, sequence)."
        )
    value = tricks().static_value(start_index)
    if value is not None:
        # Known now (eager, or a constant): as a Python int every later step stays static.
        return int(value)
    # Saturated, not wrapped: 2^32 + 5 must fail the range check, not become 5.
    return tricks().as_int32_positions(start_index)


def _smallest(positions):
    return positions.min() if isinstance(positions, np.ndarray) else tricks().smallest(positions)


def _largest(positions):
    return positions.max() if isinstance(positions, np.ndarray) else tricks().largest(positions)


def checked_positions(positions, length, batch=None, axes: int = 1):
    """`(positions, verdicts)`: `positions` of shape `(length,)` or `(batch, length)`, values
    >= 0, as an integer tensor (or a host array where the backend checks known values on
    the host), and the verdicts of the checks (`tricks().check`).

    With `axes > 1` each position is a coordinate per axis: `(length, axes)` or
    `(batch, length, axes)`. `batch`, when given, is the input's batch size, which
    per-row positions must match (a batch of 2 positions for 1 input would otherwise
    broadcast the output to 2).
    """
    t = tricks()
    positions = t.as_positions(positions)
    if "int" not in _dtype(positions):
        raise TypeError(
            f"positions must be integers (int32 or int64), got dtype {_dtype(positions)}. "
            f"Cast them with {_cast('positions')}."
        )
    shape = positions.shape if rank_of(positions) is None else tuple(positions.shape)
    if axes == 1 and rank_of(positions) not in (1, 2):
        raise ValueError(
            f"positions must have shape (sequence,) or (batch, sequence), got shape {shape}."
        )
    if axes > 1 and (rank_of(positions) not in (2, 3) or shape[-1] != axes):
        raise ValueError(
            f"positions of a {axes}-axis encoding must have shape (sequence, {axes}) or "
            f"(batch, sequence, {axes}): one coordinate per axis; got shape {shape}. "
            "keras_posenc.grid_positions makes them for a patch grid."
        )
    sequence_axis = -1 if axes == 1 else -2
    verdicts = [
        t.check(
            lambda given, expected: given == expected,
            [static_dim(positions, sequence_axis), length],
            lambda given, expected: (
                f"positions cover {given} steps but the input sequence has "
                f"{expected}; give one position per step."
            ),
        )
    ]
    if rank_of(positions) == (2 if axes == 1 else 3) and batch is not None:
        verdicts.append(
            t.check(
                lambda given, expected: given == expected,
                [static_dim(positions, 0), batch],
                lambda given, expected: (
                    f"positions have a batch of {given} but the input has {expected}; give "
                    "positions of shape (sequence,) for all rows or (batch, sequence) per row."
                ),
            )
        )
    verdicts.append(
        t.check(
            lambda smallest: smallest >= 0,
            [_smallest(positions)],
            lambda smallest: (
                f"positions must be >= 0 (they count from 0); the smallest is {smallest}."
            ),
        )
    )
    return t.after(verdicts, positions), verdicts


def positions_from_mask(mask, start_index=0):
    """Positions `start_index + cumsum(mask) - 1` (clamped at `start_index`), `(batch, sequence)`.

    Real tokens count from `start_index` whatever padding stands before them, so a
    left-padded sequence gets the positions it would have unpadded.
    """
    mask = ops.convert_to_tensor(mask)
    if rank_of(mask) != 2:
        raise ValueError(
            f"A padding mask must have shape (batch, sequence), got {tuple(mask.shape)}."
        )
    counted = tricks().maximum(ops.cumsum(ops.cast(mask, "int32"), axis=1) - 1, 0)
    return counted + checked_start_index(start_index)


def position_rows(
    table: RowTable,
    length,
    positions=None,
    start_index=0,
    *,
    limit: int,
    limit_hint: str,
    mask=None,
    combine=as_rows,
    batch=None,
    axes: int = 1,
    traced: bool | None = None,
):
    """`combine(*rows)` with the checked rows of `table` for a sequence of `length` steps.

    Args:
        table: gives rows for a run (`slice`) or for explicit positions (`gather`).
        length: the sequence length (an int, or a run-time size).
        positions: optional integer positions, `(sequence,)` or `(batch, sequence)`.
        start_index: first position of the run when `positions` is None.
        limit: positions must be below this.
        limit_hint: what to do when they are not, for the error message.
        mask: optional padding mask `(batch, sequence)`; when given (and `positions` is
            not), positions come from it (`positions_from_mask`).
        combine: what the layer makes of the rows (`inputs + rows`, a rotation); it runs
            inside the table's run-time branches (see `rows.run_rows`).
        batch: the input's batch size, which `(batch, sequence)` positions must match.
        axes: the number of coordinates per position (`table` then takes `(..., axes)`).
        traced: whether the call is traced (`tricks().is_traced` of its input).
    """
    t = tricks()
    if mask is not None and positions is None:
        positions, start_index = positions_from_mask(mask, start_index), 0
        if axes > 1:  # padding: tokens of text, at the same position on every axis
            positions = ops.stack([positions] * axes, -1)
    if positions is not None:
        if not (_is_int(start_index) and start_index == 0):
            raise ValueError(
                "Pass either `positions` or `start_index`, not both: "
                "start_index=s means positions=range(s, s + sequence_length)."
            )
        positions, verdicts = checked_positions(positions, length, batch, axes)
        largest = t.check(
            lambda largest: largest < limit,
            [_largest(positions)],
            lambda largest: (
                f"the largest position is {largest} but positions must be below "
                f"{limit}; {limit_hint}"
            ),
        )
        positions, valid = t.clamped_positions(
            t.as_int32_positions(positions), limit, [*verdicts, largest]
        )
        if len(verdicts) == 3:
            # Per-row positions of another batch would broadcast the output to theirs.
            rows_of_batch = static_dim(positions, 0)
            same_batch = t.validity([verdicts[1]], lambda: t.equal(rows_of_batch, batch))
            valid = both(valid, same_batch)
        rows = table.gather(t.after([largest], positions))
        return combine(*t.nan_unless(rows, valid))
    start, valid = _checked_run(start_index, length, limit, limit_hint)
    return table.slice(
        start, length, lambda *rows: combine(*t.nan_unless(rows, valid)), traced=traced
    )


def _checked_run(start_index, length, limit: int, limit_hint: str):
    """`(start, valid)` for a run of `length` from `start_index`: checked now where known,
    else asserted (TensorFlow), and `valid` to poison the rows by where nothing raises."""
    t = tricks()
    start = _start_index(start_index)
    if _is_int(start) and not 0 <= start < limit and not _is_int(length):
        # Out of range whatever the length: say so at trace time too (an int past int32
        # would not even become a graph value).
        raise ValueError(_run_message(start, None, limit, limit_hint))
    if not _is_int(start) and _is_int(length) and length > limit:
        # Too long from any start: say so now, at trace time (XLA drops assertions).
        raise ValueError(
            f"the sequence has {length} steps but positions must stay within {limit}; {limit_hint}"
        )
    if t.is_symbolic(length):
        # A length that is a JAX dimension variable (`jax.export`): no comparison with it
        # can be decided while tracing. The run is chosen at run time whatever its start,
        # its end checked there (NaN rows).
        start = ops.convert_to_tensor(start, "int32")
        steps = ops.convert_to_tensor(length, "int32")
        return start, (start >= 0) & (start <= limit - steps)
    # One check for both ends of the run: in a graph each assertion is a conditional.
    # `start <= limit - length`, not `start + length <= limit`: the sum of two int32
    # tensors wraps around near 2^31 and would pass.
    verdict = t.check(
        lambda first, steps: (first >= 0) & (first <= limit - steps),
        [start, length],
        lambda first, steps: _run_message(first, steps, limit, limit_hint),
    )
    valid = t.validity([verdict], lambda: (start >= 0) & (start <= limit - length))
    return t.after([verdict], start), valid


def rows_of_run(
    table: RowTable, length, start_index, *, limit: int, limit_hint: str, traced=None
) -> tuple:
    """The checked rows of positions `start_index .. start_index + length - 1`: `position_rows`
    for a run, as one function of `(length, start_index)` (`tf_backend.shared_while_stored`)."""
    return tuple(
        position_rows(
            table, length, None, start_index, limit=limit, limit_hint=limit_hint, traced=traced
        )
    )


def _run_message(first, steps, limit: int, limit_hint: str) -> str:
    if isinstance(first, int) and first < 0:
        return f"start_index must be >= 0, got {first}. Positions count from 0."
    if isinstance(first, int) and isinstance(steps, int):
        return (
            f"the positions run to {first + steps} (start_index + sequence length) but "
            f"must stay within {limit}; {limit_hint}"
        )
    if isinstance(first, int):
        return f"start_index is {first} but positions must stay below {limit}; {limit_hint}"
    return (
        f"start_index must be >= 0 and the positions must stay within {limit} "
        f"({limit_hint}); start_index and the sequence length follow."
    )
