"""Which rows of a table serve some positions: the one home of that decision.

A layer's table holds its first rows ready (`TableRows.ready`: a host table's cached rows,
a learned table's variable); a host table also computes the rows of any other position
below its `limit` from the split tables (`computed`). For a run `start .. start + length - 1`
(`run_rows`):

- a slice of the ready rows where the run fits in them;
- rows computed for the run where it does not (the exact host rows, embedded as just those
  rows, where the run is known while tracing);
- both, chosen at run time, where whether it fits is known only then;
- where no rows exist past the ready ones (a learned table, or an export's bound within
  them), a clamped start or `length` clamped rows: a run past the end still gives `length`
  rows, which its caller poisons (NaN) where assertions are dropped;
- while an export is traced with a bound (`_tf.positions_bounded`), a check that the run
  ends at or below it, and only the rows below it.

Explicit positions (`gathered_rows`) take the same bound. What the checks of the positions
themselves are (`start_index >= 0`, below the layer's limit) is `positions`' part; how
TensorFlow runs a slice, a run-time choice or a poisoned row in each mode is `_tf`'s.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from keras_posenc._checks import after, check
from keras_posenc._host_constant import HostConstant
from keras_posenc._lazy import _tf, tf


def as_rows(*rows: tf.Tensor) -> tuple[tf.Tensor, ...]:
    """The rows themselves: the default `combine` of `TableRows.slice`."""
    return rows


def _is_int(value) -> bool:
    return isinstance(value, (int, np.integer))


class TableRows:
    """Rows by position from a table: `slice` for a run, `gather` for explicit positions.

    `ready`: tables of one row count (`HostConstant`s, tensors or a variable) whose row `i`
    serves position `i`. A host table also sets `limit` (the positions it can compute rows
    for) and gives `computed(positions, below)` and `host_run(start, length)`; only its
    rows are bounded by an export (a learned table is a weight held whole, checked against
    its own length by `positions`).
    """

    limit: int | None = None

    def __init__(self, ready: Sequence):
        self.ready = tuple(ready)
        self._below: dict[int, tuple[HostConstant, ...]] = {}

    def computed(self, positions: tf.Tensor, below: int | None) -> tuple[tf.Tensor, ...]:
        """The rows of `positions` (in `[0, limit)`, and below `below` when given)."""
        raise NotImplementedError

    def host_run(self, start: int, length: int) -> tuple[tf.Tensor, ...]:
        """The exact rows of a run known while tracing, as constants of just those rows."""
        raise NotImplementedError

    def ready_below(self, bound: int) -> tuple[HostConstant, ...]:
        """The ready rows below `bound`, one set per bound (each its own stored constant)."""
        if bound not in self._below:
            self._below[bound] = tuple(HostConstant(t.array[:bound]) for t in self.ready)
        return self._below[bound]

    def slice(self, start, length, combine=as_rows):
        """`combine(*rows)` for positions `start .. start + length - 1` (see `run_rows`)."""
        return run_rows(self, start, length, combine)

    def gather(self, positions: tf.Tensor) -> tuple[tf.Tensor, ...]:
        """Rows for integer `positions` of any shape (see `gathered_rows`)."""
        return gathered_rows(self, positions)


def run_rows(table: TableRows, start, length, combine=as_rows):
    """`combine(*rows)` of `table`'s rows for `start .. start + length - 1`.

    `start` and `length` are ints or scalar int32 tensors, checked by the caller, who
    poisons the rows of a bad run (`positions.position_rows`). `combine` is what it makes
    of the rows (`inputs + rows`, a rotation); under XLA it runs inside the branches of a
    run-time choice (`_tf.choose_at_run_time`).
    """
    ready = table.ready
    bound = None if table.limit is None else _tf.position_bound()
    if bound is not None:
        start, combine = _within(bound, start, length, combine)
        if bound <= _row_count(ready):
            # A bound within the ready rows leaves no split tables in the file at all.
            return _ready_run(table.ready_below(bound), start, length, combine)
    if table.limit is None:
        return _ready_run(ready, start, length, combine)
    size = _row_count(ready)
    if _is_int(start) and _is_int(length):
        fits = start + length <= size
    elif _is_int(length) and length > size:
        fits = False  # whatever the start (and XLA rejects a slice longer than the table)
    else:
        fits = tf.get_static_value(start <= size - length)
    if fits is not None:
        rows = _sliced(ready, start, length) if fits else _computed_run(table, start, length)
        return combine(*rows)
    # `start <= size - length`, not `start + length <= size`: the sum could wrap. A
    # negative start takes the computed rows, which its caller poisons: a run longer
    # than the ready rows has no valid slice of them.
    return _tf.choose_at_run_time(
        (start >= 0) & (start <= size - length),
        # Clamped so that the untaken branch stays a valid slice.
        lambda: _sliced(ready, tf.clip_by_value(start, 0, size - length), length),
        lambda: _computed_run(table, start, length),
        combine,
        unknown=start >= 0,
    )


def gathered_rows(table: TableRows, positions: tf.Tensor) -> tuple[tf.Tensor, ...]:
    """`table`'s rows for integer `positions` of any shape, each in `[0, table.limit)`.

    A host table computes them (its split tables serve any position); while an export is
    traced with a bound, positions at or past it fail a check and take NaN rows where
    assertions are dropped, and only the rows below the bound are held.
    """
    if table.limit is None:
        return _gathered(table.ready, positions)
    bound = _tf.position_bound()
    if bound is None:
        return table.computed(positions, None)
    largest = tf.reduce_max(positions)
    checks = check(
        lambda top: top < bound,
        [largest],
        lambda top: f"the largest of the positions is {top}, " + _past_bound(bound),
    )
    valid = True if not checks else largest < bound  # no checks: they ran now
    # Clamped so that no runtime fails on the lookup: the rows are poisoned instead.
    positions = tf.clip_by_value(after(checks, positions), 0, bound - 1)
    if bound <= _row_count(table.ready):
        rows = _gathered(table.ready_below(bound), positions)
    else:
        rows = table.computed(positions, bound)
    return _tf.nan_unless(rows, valid)


def _within(bound: int, start, length, combine):
    """`start` and `combine` for a run that must end at or below `bound`: checked now when
    both are known, else an assertion, and NaN rows where assertions are dropped."""
    # `start <= bound - length`, not `start + length <= bound`: the sum could wrap.
    checks = check(
        lambda first, steps: first <= bound - steps,
        [start, length],
        lambda first, steps: (
            f"start_index {first} + sequence length {steps} run past the last position, "
            + _past_bound(bound)
        ),
    )
    valid = True if _is_int(start) and _is_int(length) else start <= bound - length
    return after(checks, start), lambda *rows: combine(*_tf.nan_unless(rows, valid))


def _past_bound(bound: int) -> str:
    return (
        f"but this model was exported for positions below {bound} (max_sequence_length): "
        "its files hold the rows below it only. Export it again with a larger "
        "max_sequence_length, or none."
    )


def _computed_run(table: TableRows, start, length) -> tuple[tf.Tensor, ...]:
    """The rows of a run past the ready rows (or of one whose start is known at run time)."""
    if _is_int(start) and _is_int(length):
        if not tf.executing_eagerly() and 0 <= start <= table.limit - length:
            # Known while tracing: exact host rows, embedded as just those rows.
            return table.host_run(int(start), int(length))
    bound = _tf.position_bound()
    # Clamped into the split tables' range (or the export's bound); the caller poisons
    # the rows of bad positions.
    top = table.limit if bound is None else bound
    positions = tf.clip_by_value(tf.range(length) + start, 0, top - 1)
    return table.computed(positions, bound)


def _row_count(tables: Sequence) -> int:
    first = tables[0]
    return (first.array if isinstance(first, HostConstant) else first).shape[0]


def _tensor(table) -> tf.Tensor:
    return table.tensor() if isinstance(table, HostConstant) else table


def _gathered(tables: Sequence, positions: tf.Tensor) -> tuple[tf.Tensor, ...]:
    return tuple(tf.gather(_tensor(t), positions) for t in tables)


def _sliced(tables: Sequence, start, length) -> tuple[tf.Tensor, ...]:
    return tuple(
        t.rows(start, length) if isinstance(t, HostConstant) else _tf.slice_rows(t, start, length)
        for t in tables
    )


def _ready_run(tables: Sequence, start, length, combine):
    """`combine(*rows)` of `tables`' rows `start .. start + length - 1`, where no rows exist
    past them, for a run the caller has checked and poisons.

    A run past the tables' end must still give `length` rows where assertions are
    dropped (converters, XLA): a slice would stop at the end, and the runtime would then
    fail on a shape instead of returning NaN. So a start is clamped into the tables where
    the length fits them, and a length that may not fit takes `length` clamped rows in
    place of the slice when it does not. Elsewhere the checks raise before the slice runs.
    """
    # A variable is read once, as one tensor (a custom gradient under XLA takes no variable).
    tables = [t if isinstance(t, HostConstant) else tf.convert_to_tensor(t) for t in tables]
    size = _row_count(tables)

    def clamped():
        steps = tf.clip_by_value(tf.range(length) + start, 0, size - 1)
        return _gathered(tables, steps)

    if _is_int(start) and _is_int(length):
        return combine(*_sliced(tables, start, length))
    if _is_int(length) and length > size:
        return combine(*clamped())
    first = start
    if not _is_int(start):
        first = tf.clip_by_value(start, 0, tf.maximum(size - length, 0))
    if _is_int(length) or not _tf.assertions_dropped():
        return combine(*_sliced(tables, first, length))
    return _tf.choose_at_run_time(
        tf.logical_and(start >= 0, start <= size - length),
        lambda: _sliced(tables, first, length),
        clamped,
        combine,
        unknown=(length if _is_int(start) else start) >= 0,
    )
