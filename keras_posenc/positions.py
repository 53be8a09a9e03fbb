"""Which positions a call covers, checked: a run from `start_index`, or explicit `positions`.

Every layer takes the same `positions=None, start_index=0` pair and asks a table for the
rows of those positions: `table.slice(start, length, combine)` for a run,
`table.gather(positions)` otherwise, and `combine`s them with its input. Checks raise at
once when the values are known (eagerly, or static at trace time) and become graph
assertions otherwise. XLA compiles assertions away, so under `jit_compile=True` the rows
of a call whose positions fail the checks become NaN instead of a plausible wrong answer.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np
import tensorflow as tf

from keras_posenc.frequencies import as_rows, in_xla_context


class RowTable(Protocol):
    def slice(self, start, length, combine): ...

    def gather(self, positions: tf.Tensor) -> tuple[tf.Tensor, ...]: ...


def static_dim(x: tf.Tensor, axis: int):
    """`x.shape[axis]` as a Python int when known, else the runtime size."""
    size = x.shape[axis]
    return int(size) if size is not None else tf.shape(x)[axis]


def _check(predicate, values, message, error=ValueError) -> list:
    """Raise `error(message(*values))` unless `predicate(*values)` holds for every element.

    With every value known (Python numbers, eager or constant tensors) the check runs now
    and `[]` is returned; otherwise the check is a graph assertion, returned in a list so
    the caller can make the computation wait for it (a slice could otherwise fail first,
    with a message about the slice instead of the input).
    """
    # tf.is_tensor is slow on Python numbers (a Protocol check): test for them first.
    known = [v if isinstance(v, (int, np.integer)) else tf.get_static_value(v) for v in values]
    if all(k is not None for k in known):
        if not np.all(predicate(*known)):
            raise error(message(*(np.asarray(k).tolist() for k in known)))
        return []
    values = [tf.convert_to_tensor(v) for v in values]
    tensors = [tf.cast(v, tf.int64) for v in values]
    # Shown as int32 where they are: an Assert whose data are all int32 or strings is one
    # op; with int64 data it is wrapped in a conditional (several ops a call in a graph).
    shown = [v if v.dtype == tf.int32 else t for v, t in zip(values, tensors, strict=True)]
    return [
        tf.debugging.Assert(
            tf.reduce_all(predicate(*tensors)),
            [message(*["(value below)"] * len(values)), *shown],
        )
    ]


def _after(checks: list, tensor):
    if not checks:
        return tensor
    with tf.control_dependencies(checks):
        return tf.identity(tensor)


def checked_start_index(start_index):
    """`start_index` as a Python int or a scalar int32 tensor, >= 0."""
    start = _start_index(start_index)
    checks = _check(
        lambda s: s >= 0,
        [start],
        lambda s: f"start_index must be >= 0, got {s}. Positions count from 0.",
    )
    return _after(checks, start)


def _start_index(start_index):
    """`start_index` as a Python int or a scalar int32 tensor; its sign is checked by callers."""
    if isinstance(start_index, (bool, np.bool_)):
        raise TypeError(f"start_index must be an integer, got the bool {start_index!r}.")
    if isinstance(start_index, (int, np.integer)):
        return int(start_index)
    start_index = tf.convert_to_tensor(start_index)
    if not start_index.dtype.is_integer:
        raise TypeError(
            f"start_index must be an int32 or int64 scalar, got dtype {start_index.dtype.name}. "
            "Cast it with tf.cast(start_index, 'int32')."
        )
    if start_index.shape.rank not in (None, 0):
        raise ValueError(
            f"start_index must be a scalar, got shape {start_index.shape}. "
            "For a different start per sequence, pass `positions` of shape (batch, sequence)."
        )
    value = tf.get_static_value(start_index)
    if value is not None:
        # Known now (eager, or a constant): as a Python int every later step stays static.
        return int(value)
    if start_index.dtype.size > 4 or start_index.dtype.is_unsigned:
        # Saturate rather than wrap: 2^32 + 5 must fail the range check, not become 5.
        bounds = np.iinfo(np.int32)
        start_index = tf.clip_by_value(
            tf.cast(start_index, tf.int64), np.int64(bounds.min), np.int64(bounds.max)
        )
    return tf.cast(start_index, tf.int32)


def checked_positions(positions, length) -> tf.Tensor:
    """`positions` as an integer tensor of shape `(length,)` or `(batch, length)`, values >= 0."""
    positions = tf.convert_to_tensor(positions)
    if not positions.dtype.is_integer:
        raise TypeError(
            f"positions must be integers (int32 or int64), got dtype {positions.dtype.name}. "
            "Cast them with tf.cast(positions, 'int32')."
        )
    if positions.shape.rank not in (1, 2):
        raise ValueError(
            "positions must have shape (sequence,) or (batch, sequence), "
            f"got shape {positions.shape}."
        )
    checks = _check(
        lambda given, expected: given == expected,
        [static_dim(positions, -1), length],
        lambda given, expected: (
            f"positions cover {given} steps but the input sequence has "
            f"{expected}; give one position per step."
        ),
    )
    checks += _check(
        lambda smallest: smallest >= 0,
        [tf.reduce_min(positions)],
        lambda smallest: f"positions must be >= 0 (they count from 0); the smallest is {smallest}.",
    )
    return _after(checks, positions)


def positions_from_mask(mask: tf.Tensor, start_index=0) -> tf.Tensor:
    """Positions `start_index + cumsum(mask) - 1` (clamped at `start_index`), `(batch, sequence)`.

    Real tokens count from `start_index` whatever padding stands before them, so a
    left-padded sequence gets the positions it would have unpadded.
    """
    mask = tf.convert_to_tensor(mask)
    if mask.shape.rank != 2:
        raise ValueError(f"A padding mask must have shape (batch, sequence), got {mask.shape}.")
    counted = tf.maximum(tf.cumsum(tf.cast(mask, tf.int32), axis=1) - 1, 0)
    return counted + checked_start_index(start_index)


def _poisoned_under_xla(rows: tuple, valid) -> tuple:
    """`rows`, or NaN in their place when `valid` is False and the graph is compiled by XLA.

    XLA compiles assertions to nothing and clamps out-of-range gathers, so a bad position
    would give a plausible wrong row; NaN makes the bad input impossible to miss.
    """
    if isinstance(valid, (bool, np.bool_)) or not in_xla_context():
        return rows
    return tuple(tf.where(valid, row, tf.constant(float("nan"), row.dtype)) for row in rows)


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
):
    """`combine(*rows)` with the checked rows of `table` for a sequence of `length` steps.

    Args:
        table: gives rows for a run (`slice`) or for explicit positions (`gather`).
        length: the sequence length (int or scalar int32 tensor).
        positions: optional integer positions, `(sequence,)` or `(batch, sequence)`.
        start_index: first position of the run when `positions` is None.
        limit: positions must be below this.
        limit_hint: what to do when they are not, for the error message.
        mask: optional padding mask `(batch, sequence)`; when given (and `positions` is
            not), positions come from it (`positions_from_mask`).
        combine: what the layer makes of the rows (`inputs + rows`, a rotation); it runs
            inside the table's runtime branches (see `PositionTable.slice`).
    """
    if mask is not None and positions is None:
        positions, start_index = positions_from_mask(mask, start_index), 0
    if positions is not None:
        if not (isinstance(start_index, (int, np.integer)) and start_index == 0):
            raise ValueError(
                "Pass either `positions` or `start_index`, not both: "
                "start_index=s means positions=range(s, s + sequence_length)."
            )
        positions = checked_positions(positions, length)
        checks = _check(
            lambda largest: largest < limit,
            [tf.reduce_max(positions)],
            lambda largest: (
                f"the largest position is {largest} but positions must be below "
                f"{limit}; {limit_hint}"
            ),
        )
        valid = (tf.reduce_min(positions) >= 0) & (tf.reduce_max(positions) < limit)
        rows = table.gather(_after(checks, tf.cast(positions, tf.int32)))
        return combine(*_poisoned_under_xla(rows, valid))
    # One assertion for both ends of the run: in a graph each assertion is a conditional.
    start = _start_index(start_index)
    if not isinstance(start, int) and isinstance(length, (int, np.integer)) and length > limit:
        # Too long from any start: say so now, at trace time (XLA drops assertions).
        raise ValueError(
            f"the sequence has {length} steps but positions must stay within {limit}; {limit_hint}"
        )

    def run_message(first, steps):
        if isinstance(first, int) and first < 0:
            return f"start_index must be >= 0, got {first}. Positions count from 0."
        if isinstance(first, int) and isinstance(steps, int):
            return (
                f"the positions run to {first + steps} (start_index + sequence length) but "
                f"must stay within {limit}; {limit_hint}"
            )
        return (
            f"start_index must be >= 0 and the positions must stay within {limit} "
            f"({limit_hint}); start_index and the sequence length follow."
        )

    # `start <= limit - length`, not `start + length <= limit`: the sum of two int32
    # tensors wraps around near 2^31 and would pass.
    checks = _check(
        lambda first, steps: (first >= 0) & (first <= limit - steps), [start, length], run_message
    )
    valid = (start >= 0) & (start <= limit - length)
    return table.slice(
        _after(checks, start),
        length,
        lambda *rows: combine(*_poisoned_under_xla(rows, valid)),
    )
