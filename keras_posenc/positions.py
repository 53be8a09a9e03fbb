"""Which positions a call covers, checked: a run from `start_index`, or explicit `positions`.

Every layer takes the same `positions=None, start_index=0` pair and asks a table for the
rows of those positions: `table.slice(start, length, combine)` for a run,
`table.gather(positions)` otherwise, and `combine`s them with its input. Checks raise at
once when the values are known (eagerly, or static at trace time) and become graph
assertions otherwise. XLA compiles assertions away and converters (tf2onnx, the TFLite
converter) drop them, so in every graph the rows of positions that fail the checks also
become NaN: under `jit_compile=True`, in a SavedModel, ONNX or LiteRT file a bad position
gives NaN, never a plausible wrong answer.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from keras_posenc._checks import after, check
from keras_posenc._lazy import _tf, tf
from keras_posenc.rows import as_rows


class RowTable(Protocol):
    def slice(self, start, length, combine): ...

    def gather(self, positions: tf.Tensor) -> tuple[tf.Tensor, ...]: ...


def static_dim(x: tf.Tensor, axis: int):
    """`x.shape[axis]` as a Python int when known, else the runtime size."""
    size = x.shape[axis]
    return int(size) if size is not None else tf.shape(x)[axis]


def checked_start_index(start_index):
    """`start_index` as a Python int or a scalar int32 tensor, >= 0."""
    start = _start_index(start_index)
    checks = check(
        lambda s: s >= 0,
        [start],
        lambda s: f"start_index must be >= 0, got {s}. Positions count from 0.",
    )
    return after(checks, start)


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
    # Saturated, not wrapped: 2^32 + 5 must fail the range check, not become 5.
    return _tf.as_int32_positions(start_index)


def checked_positions(positions, length, batch=None, axes: int = 1) -> tf.Tensor:
    """`positions` as an integer tensor of shape `(length,)` or `(batch, length)`, values >= 0.

    With `axes > 1` each position is a coordinate per axis: `(length, axes)` or
    `(batch, length, axes)`. `batch`, when given, is the input's batch size, which
    per-row positions must match (a batch of 2 positions for 1 input would otherwise
    broadcast the output to 2).
    """
    positions = tf.convert_to_tensor(positions)
    if not positions.dtype.is_integer:
        raise TypeError(
            f"positions must be integers (int32 or int64), got dtype {positions.dtype.name}. "
            "Cast them with tf.cast(positions, 'int32')."
        )
    rank = positions.shape.rank
    if axes == 1 and rank not in (1, 2):
        raise ValueError(
            "positions must have shape (sequence,) or (batch, sequence), "
            f"got shape {positions.shape}."
        )
    if axes > 1 and (rank not in (2, 3) or positions.shape[-1] != axes):
        raise ValueError(
            f"positions of a {axes}-axis encoding must have shape (sequence, {axes}) or "
            f"(batch, sequence, {axes}): one coordinate per axis; got shape {positions.shape}. "
            "keras_posenc.grid_positions makes them for a patch grid."
        )
    sequence_axis = -1 if axes == 1 else -2
    checks = check(
        lambda given, expected: given == expected,
        [static_dim(positions, sequence_axis), length],
        lambda given, expected: (
            f"positions cover {given} steps but the input sequence has "
            f"{expected}; give one position per step."
        ),
    )
    if rank == (2 if axes == 1 else 3) and batch is not None:
        checks += check(
            lambda given, expected: given == expected,
            [static_dim(positions, 0), batch],
            lambda given, expected: (
                f"positions have a batch of {given} but the input has {expected}; give "
                "positions of shape (sequence,) for all rows or (batch, sequence) per row."
            ),
        )
    checks += check(
        lambda smallest: smallest >= 0,
        [tf.reduce_min(positions)],
        lambda smallest: f"positions must be >= 0 (they count from 0); the smallest is {smallest}.",
    )
    return after(checks, positions)


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
        batch: the input's batch size, which `(batch, sequence)` positions must match.
        axes: the number of coordinates per position (`table` then takes `(..., axes)`).
    """
    if mask is not None and positions is None:
        positions, start_index = positions_from_mask(mask, start_index), 0
        if axes > 1:  # padding: tokens of text, at the same position on every axis
            positions = tf.stack([positions] * axes, -1)
    if positions is not None:
        if not (isinstance(start_index, (int, np.integer)) and start_index == 0):
            raise ValueError(
                "Pass either `positions` or `start_index`, not both: "
                "start_index=s means positions=range(s, s + sequence_length)."
            )
        positions = checked_positions(positions, length, batch, axes)
        checks = check(
            lambda largest: largest < limit,
            [tf.reduce_max(positions)],
            lambda largest: (
                f"the largest position is {largest} but positions must be below "
                f"{limit}; {limit_hint}"
            ),
        )
        positions = _tf.as_int32_positions(positions)
        if tf.get_static_value(positions) is not None:
            valid = True  # the checks above ran now
        else:
            # One bad position poisons the whole call: no part of it is to be trusted.
            valid = (tf.reduce_min(positions) >= 0) & (tf.reduce_max(positions) < limit)
            # Clamped so that no runtime fails on the lookup: the rows are poisoned instead.
            positions = tf.clip_by_value(positions, 0, limit - 1)
        rows_of_batch = static_dim(positions, 0) if positions.shape.rank == axes + 1 else None
        if (
            rows_of_batch is not None
            and batch is not None
            and not (isinstance(rows_of_batch, int) and isinstance(batch, int))
        ):
            # Per-row positions of another batch would broadcast the output to theirs.
            same_batch = tf.equal(rows_of_batch, batch)
            valid = same_batch if valid is True else valid & same_batch
        rows = table.gather(after(checks, positions))
        return combine(*_tf.nan_unless(rows, valid))
    # One assertion for both ends of the run: in a graph each assertion is a conditional.
    start = _start_index(start_index)
    if isinstance(start, int) and not 0 <= start < limit and not isinstance(length, int):
        # Out of range whatever the length: say so at trace time too (an int past int32
        # would not even become a graph value).
        raise ValueError(_run_message(start, None, limit, limit_hint))
    if not isinstance(start, int) and isinstance(length, (int, np.integer)) and length > limit:
        # Too long from any start: say so now, at trace time (XLA drops assertions).
        raise ValueError(
            f"the sequence has {length} steps but positions must stay within {limit}; {limit_hint}"
        )
    # `start <= limit - length`, not `start + length <= limit`: the sum of two int32
    # tensors wraps around near 2^31 and would pass.
    checks = check(
        lambda first, steps: (first >= 0) & (first <= limit - steps),
        [start, length],
        lambda first, steps: _run_message(first, steps, limit, limit_hint),
    )
    known = isinstance(start, int) and isinstance(length, (int, np.integer))
    valid = True if known else (start >= 0) & (start <= limit - length)
    return table.slice(
        after(checks, start),
        length,
        lambda *rows: combine(*_tf.nan_unless(rows, valid)),
    )


def rows_of_run(table: RowTable, length, start_index, *, limit: int, limit_hint: str) -> tuple:
    """The checked rows of positions `start_index .. start_index + length - 1`: `position_rows`
    for a run, as one function of `(length, start_index)` (`_tf.shared_while_stored`)."""
    return tuple(
        position_rows(table, length, None, start_index, limit=limit, limit_hint=limit_hint)
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
