"""Which rows of a table serve some positions: the one home of that decision, for every backend.

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
  rows, which its caller poisons (NaN) where nothing can raise;
- while an export is traced with a bound (TensorFlow: `tf_backend.positions_bounded`), a check
  that the run ends at or below it, and only the rows below it;
- for a run of a length unknown while tracing on JAX (`jax.export`), gathers, chosen at
  run time.

Explicit positions (`gathered_rows`) take the same bound. What the checks of the positions
themselves are (`start_index >= 0`, below the layer's limit) is `positions`' part; how a
backend runs a slice, a run-time choice or a poisoned row in each mode is its tricks'
(`tricks()`: `keras_posenc.backend.tensorflow`, `keras_posenc.backend.keras_ops`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from keras import ops

from keras_posenc.backend.lazy import tricks
from keras_posenc.tables.host_constant import HostConstant


def as_rows(*rows) -> tuple:
    """The rows themselves: the default `combine` of `TableRows.slice`."""
    return rows


def _is_int(value) -> bool:
    return isinstance(value, (int, np.integer))


def clamped_run(start, length, top: int):
    """The positions `start .. start + length - 1` as int32, clamped into `[0, top)` (the
    caller poisons the rows of bad ones)."""
    if _is_int(start) and _is_int(length) and 0 <= start <= top - length:
        return ops.arange(start, start + length, dtype="int32")  # in range: nothing to clamp
    return ops.clip(ops.arange(length, dtype="int32") + start, 0, top - 1)


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

    def computed(self, positions, below: int | None) -> tuple:
        """The rows of `positions` (in `[0, limit)`, and below `below` when given)."""
        raise NotImplementedError

    def computed_run(self, start, length, top: int, below: int | None) -> tuple:
        """The rows of the run `start .. start + length - 1`, clamped below `top`."""
        return self.computed(clamped_run(start, length, top), below)

    def host_run(self, start: int, length: int) -> tuple:
        """The exact rows of a run known while tracing, as constants of just those rows."""
        raise NotImplementedError

    def ready_below(self, bound: int) -> tuple[HostConstant, ...]:
        """The ready rows below `bound`, one set per bound (each its own stored constant)."""
        if bound not in self._below:
            self._below[bound] = tuple(HostConstant(rows.array[:bound]) for rows in self.ready)
        return self._below[bound]

    def slice(self, start, length, combine=as_rows, traced=None):
        """`combine(*rows)` for positions `start .. start + length - 1` (see `run_rows`)."""
        return run_rows(self, start, length, combine, traced)

    def gather(self, positions) -> tuple:
        """Rows for integer `positions` of any shape (see `gathered_rows`)."""
        return gathered_rows(self, positions)


def run_rows(table: TableRows, start, length, combine=as_rows, traced=None):
    """`combine(*rows)` of `table`'s rows for `start .. start + length - 1`.

    `start` and `length` are ints or scalar int32 tensors (JAX: `length` may be a symbolic
    size), checked by the caller, who poisons the rows of a bad run
    (`positions.position_rows`). `combine` is what it makes of the rows (`inputs + rows`,
    a rotation); where the rows are chosen at run time it may run inside the branches
    (`choose_at_run_time`). `traced`: whether the call's input is traced (the call is also
    traced where its start is), which embeds the rows of a known run as constants of just
    those rows.
    """
    t = tricks()
    # A traced start traces the call, whatever its input (a constant closed over by `jax.jit`).
    traced = bool(traced) or t.is_traced(start)
    ready = table.ready
    bound = None if table.limit is None else t.position_bound()
    if bound is not None:
        start, combine = _within(bound, start, length, combine)
        if bound <= _row_count(ready):
            # A bound within the ready rows leaves no split tables in the file at all.
            return _ready_run(table.ready_below(bound), start, length, combine, traced)
    if table.limit is None:
        return _ready_run(ready, start, length, combine, traced)
    size = _row_count(ready)
    if t.is_symbolic(length):
        return combine(*_symbolic_run(table, start, length))
    if _is_int(start) and _is_int(length):
        fits = start + length <= size
    elif _is_int(length) and length > size:
        fits = False  # whatever the start (and XLA rejects a slice longer than the table)
    else:
        fits = t.static_value(start <= size - length)
    if fits is not None:
        if fits:
            return combine(*_sliced(ready, start, length, traced))
        return combine(*_computed_run(table, start, length, traced))
    # `start <= size - length`, not `start + length <= size`: the sum could wrap. A
    # negative start takes the computed rows, which its caller poisons: a run longer
    # than the ready rows has no valid slice of them.
    return t.choose_at_run_time(
        (start >= 0) & (start <= size - length),
        # Clamped so that the untaken branch stays a valid slice.
        lambda: _sliced(ready, ops.clip(start, 0, size - length), length, traced),
        lambda: _computed_run(table, start, length, traced),
        combine,
        unknown=lambda: start >= 0,
    )


def gathered_rows(table: TableRows, positions) -> tuple:
    """`table`'s rows for integer `positions` of any shape, each in `[0, table.limit)`.

    A host table computes them (its split tables serve any position); while an export is
    traced with a bound, positions at or past it fail a check and take NaN rows where
    assertions are dropped, and only the rows below the bound are held.
    """
    t = tricks()
    if table.limit is None:
        return _gathered(table.ready, positions)
    bound = t.position_bound()
    if bound is None:
        return table.computed(positions, None)
    largest = ops.max(positions)
    verdict = t.check(
        lambda top: top < bound,
        [largest],
        lambda top: f"the largest of the positions is {top}, " + _past_bound(bound),
    )
    valid = t.validity([verdict], lambda: largest < bound)
    # Clamped so that no runtime fails on the lookup: the rows are poisoned instead.
    positions = ops.clip(t.after([verdict], positions), 0, bound - 1)
    if bound <= _row_count(table.ready):
        rows = _gathered(table.ready_below(bound), positions)
    else:
        rows = table.computed(positions, bound)
    return t.nan_unless(rows, valid)


def _within(bound: int, start, length, combine):
    """`start` and `combine` for a run that must end at or below `bound`: checked now when
    both are known, else an assertion, and NaN rows where assertions are dropped."""
    t = tricks()
    # `start <= bound - length`, not `start + length <= bound`: the sum could wrap.
    verdict = t.check(
        lambda first, steps: first <= bound - steps,
        [start, length],
        lambda first, steps: (
            f"start_index {first} + sequence length {steps} run past the last position, "
            + _past_bound(bound)
        ),
    )
    valid = t.validity([verdict], lambda: start <= bound - length)
    return t.after([verdict], start), lambda *rows: combine(*t.nan_unless(rows, valid))


def _past_bound(bound: int) -> str:
    return (
        f"but this model was exported for positions below {bound} (max_sequence_length): "
        "its files hold the rows below it only. Export it again with a larger "
        "max_sequence_length, or none."
    )


def _computed_run(table: TableRows, start, length, traced: bool) -> tuple:
    """The rows of a run past the ready rows (or of one whose start is known at run time)."""
    if _is_int(start) and _is_int(length):
        if traced and 0 <= start <= table.limit - length:
            # Known while tracing: exact host rows, embedded as just those rows.
            return table.host_run(int(start), int(length))
    bound = tricks().position_bound()
    # Clamped into the split tables' range (or the export's bound); the caller poisons
    # the rows of bad positions.
    top = table.limit if bound is None else bound
    return table.computed_run(start, length, top, bound)


def _symbolic_run(table: TableRows, start, length) -> tuple:
    """The rows of a run of a symbolic length (`jax.export`; `start` a traced int32), by
    gathers (a slice's size must be known to fit its table): the ready rows while the run
    fits them, else the computed rows, chosen at run time.

    Both are the rows eager and `jax.jit` calls give: inside the cached rows the split
    rows equal them bitwise (coarse row 0 is sin 0, cos 1: the products give the fine row,
    FMA or not), so the choice is for speed, one gather instead of four and the products.
    The conditional also keeps the rows from fusing into what follows, where XLA would
    compute them again for every batch row and head (docs/backends.md, "Keras's own
    export": the cost with and without it).
    """
    size = _row_count(table.ready)
    positions = clamped_run(start, length, table.limit)

    def ready():
        steps = ops.minimum(positions, size - 1)
        return tuple(ops.take(rows.array, steps, axis=0) for rows in table.ready)

    def computed():
        return table.computed(positions, None)

    fits = (start >= 0) & (start <= size - ops.convert_to_tensor(length, "int32"))
    return ops.cond(fits, ready, computed)


def _row_count(tables: Sequence) -> int:
    first = tables[0]
    return (first.array if isinstance(first, HostConstant) else first).shape[0]


def _tensor(table, traced: bool):
    return table.tensor(traced) if isinstance(table, HostConstant) else table


def _gathered(tables: Sequence, positions) -> tuple:
    t = tricks()
    traced = t.is_traced(positions)
    return tuple(t.take(_tensor(table, traced), positions, 0) for table in tables)


def _sliced(tables: Sequence, start, length, traced: bool) -> tuple:
    return tuple(
        table.rows(start, length, traced)
        if isinstance(table, HostConstant)
        else tricks().slice_rows(table, start, length)
        for table in tables
    )


def _ready_run(tables: Sequence, start, length, combine, traced: bool):
    """`combine(*rows)` of `tables`' rows `start .. start + length - 1`, where no rows exist
    past them, for a run the caller has checked and poisons.

    A run past the tables' end must still give `length` rows where nothing raises
    (converters, XLA, JAX): a slice would stop at the end, and the runtime would then fail
    on a shape instead of returning NaN. So a start is clamped into the tables where the
    length fits them, and a length that may not fit takes `length` clamped rows in place
    of the slice when it does not. Elsewhere the checks raise before the slice runs.
    """
    t = tricks()
    tables = [table if isinstance(table, HostConstant) else t.read(table) for table in tables]
    size = _row_count(tables)

    def clamped():
        return _gathered(tables, clamped_run(start, length, size))

    if _is_int(start) and _is_int(length):
        return combine(*_sliced(tables, start, length, traced))
    if t.is_symbolic(length) or (_is_int(length) and length > size):
        return combine(*clamped())
    first = start
    if not _is_int(start):
        first = ops.clip(start, 0, t.maximum(size - length, 0))
    if _is_int(length) or not t.assertions_dropped():
        return combine(*_sliced(tables, first, length, traced))
    return t.choose_at_run_time(
        ops.logical_and(start >= 0, start <= size - length),
        lambda: _sliced(tables, first, length, traced),
        clamped,
        combine,
        unknown=lambda: (length if _is_int(start) else start) >= 0,
    )
