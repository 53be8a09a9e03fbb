"""Which rows serve a call on JAX and PyTorch: `keras_posenc.rows` for those backends.

Each kind of table the layers hold (a host `PositionTable`, a learned variable, a switch
by length, dynamic NTK rows, several axes) gives rows for a run (`run_rows`) or for
explicit positions (`gathered_rows`); `make` turns computed `(sin, cos)` into the layer's
rows (the cached rows are made already). `position_rows` checks the positions first, as
`keras_posenc.positions.position_rows` does, and poisons the rows of traced bad ones.
A symbolic sequence length (`jax.export`, as Keras's `model.export` from JAX traces) is
neither compared nor sliced by while tracing: its runs are gathers, chosen at run time.
"""

from __future__ import annotations

import numpy as np
from keras import ops

from keras_posenc import _keras_ops as kops
from keras_posenc.axes import AxesRows
from keras_posenc.frequencies import CACHED_POSITIONS, PositionTable
from keras_posenc.rope_scaling import DynamicRows, SwitchByLength

# Runs of at most this many row values take both sources and a `where` instead of a
# conditional (`python -m benchmarks --backend jax`: the 1x16x64 cases, tensor start).
SMALL_RUN_VALUES = 4096


def as_rows(*rows) -> tuple:
    """The rows themselves: the default `combine`."""
    return rows


def position_rows(
    table,
    make,
    length: int,
    positions=None,
    start_index=0,
    *,
    limit: int,
    limit_hint: str,
    mask=None,
    batch=None,
    axes: int = 1,
    traced: bool = False,
    combine=as_rows,
):
    """`combine(*rows)` with the checked rows of `table` for a call (see
    `positions.position_rows`); `traced`: the inputs are traced (`jax.jit`). Where the rows
    are chosen at run time, `combine` runs inside each branch, so that XLA fuses the row
    lookup into it instead of writing the rows out (as `_tf.choose_at_run_time`)."""
    valid = True
    if mask is not None and positions is None:
        positions, valid = kops.positions_from_mask(mask, start_index, axes)
        start_index = 0
    if positions is not None:
        if not (isinstance(start_index, (int, np.integer)) and start_index == 0):
            raise ValueError(
                "Pass either `positions` or `start_index`, not both: "
                "start_index=s means positions=range(s, s + sequence_length)."
            )
        positions, checked = kops.checked_positions(
            positions, length, batch, axes, limit, limit_hint
        )
        rows = gathered_rows(table, make, positions)
        return combine(*kops.nan_unless(rows, kops.both(valid, checked)))
    start, valid = kops.checked_run(start_index, length, limit, limit_hint)
    return run_rows(
        table, make, start, length, traced, lambda rows: combine(*kops.nan_unless(rows, valid))
    )


def run_rows(table, make, start, length: int, traced: bool = False, finish=tuple):
    """`finish(rows)` of positions `start .. start + length - 1` (`start` an int or a traced
    int32); `traced`: the call is being traced (`jax.jit`), which embeds static rows as
    constants. `length` may be symbolic (`jax.export`, `kops.is_symbolic`; `start` is then
    a traced int32): the rows are then gathered, never sliced, as for a run too long to
    slice (a slice's size must be known to fit its table)."""
    if isinstance(table, SwitchByLength):
        return _switched(
            table, start + length, lambda t: run_rows(t, make, start, length, traced, finish)
        )
    if isinstance(table, (DynamicRows, AxesRows)):
        run = ops.arange(length, dtype="int32") + start
        if isinstance(table, AxesRows):
            run = ops.stack([run] * table.axes, -1)
        return finish(gathered_rows(table, make, run))
    if isinstance(table, PositionTable):
        return _host_run(table, make, start, length, traced, finish)
    return finish(_variable_run(ops.convert_to_tensor(table.ready[0]), start, length))


def gathered_rows(table, make, positions) -> tuple:
    """Rows for int32 `positions` of any shape, each in the table's range."""
    if isinstance(table, SwitchByLength):
        total = ops.max(positions) + 1
        return _switched(table, total, lambda t: gathered_rows(t, make, positions))
    if isinstance(table, DynamicRows):
        turns = kops.dynamic_turns(
            ops.max(positions) + 1, table.omega, table.factor, table.max_position_embeddings
        )
        return tuple(make(*kops.exact_sin_cos(positions, turns)))
    if isinstance(table, AxesRows):
        return tuple(make(*_axes_sin_cos(table.sin_cos.__self__, positions)))
    if isinstance(table, PositionTable):
        return tuple(make(*kops.split_sin_cos(table.frequencies, positions)))
    return (ops.take(ops.convert_to_tensor(table.ready[0]), positions, axis=0),)


def _switched(table: SwitchByLength, total_length, rows) -> tuple:
    total = kops.known(total_length)
    if total is not None:
        return rows(table.long if int(total) > table.switch_length else table.short)
    return ops.cond(
        total_length > table.switch_length, lambda: rows(table.long), lambda: rows(table.short)
    )


def _axes_sin_cos(pairs, positions):
    """`AxisPairs.sin_cos` here: each axis's split tables, pairs put back in order."""
    parts = [
        kops.split_sin_cos(frequencies, positions[..., a])
        for a, frequencies in enumerate(pairs.tables)
    ]
    sin = ops.concatenate([p[0] for p in parts], -1)
    cos = ops.concatenate([p[1] for p in parts], -1)
    if pairs.order is not None:
        order = pairs.order.astype(np.int32)
        sin, cos = ops.take(sin, order, axis=-1), ops.take(cos, order, axis=-1)
    return sin, cos


def _host_run(table: PositionTable, make, start, length: int, traced: bool, finish):
    """`finish` of a run of a host table: cached rows, computed rows, or a choice between
    them (`finish` then runs inside each branch)."""
    cached = table.cached
    if isinstance(start, int):
        if start + length <= CACHED_POSITIONS and not traced:
            # Eagerly a slice of the table made a tensor once: no copy of the rows per call.
            cached = kops.eager_tensors(table, table.cached)
            return finish(tuple(rows[start : start + length] for rows in cached))
        if start + length <= CACHED_POSITIONS:
            rows = [rows[start : start + length] for rows in cached]
        elif traced:
            # Static while traced: the exact host rows, a constant of just those rows (as
            # TensorFlow embeds them in a graph).
            rows = table._host_rows(np.arange(start, start + length))
        else:
            positions = ops.arange(start, start + length, dtype="int32")
            return finish(tuple(make(*kops.split_sin_cos(table.frequencies, positions))))
        return finish(tuple(ops.convert_to_tensor(r) for r in rows))

    if kops.is_symbolic(length):
        return finish(_symbolic_run(table, make, start, length))
    if length > CACHED_POSITIONS:
        positions = ops.clip(ops.arange(length, dtype="int32") + start, 0, table.limit - 1)
        return finish(tuple(make(*kops.split_sin_cos(table.frequencies, positions))))
    size = CACHED_POSITIONS

    def computed():
        return tuple(make(*kops.run_sin_cos(table.frequencies, start, length)))

    def sliced():
        first = ops.clip(start, 0, size - length)
        return tuple(ops.slice(rows, (first, 0), (length, rows.shape[1])) for rows in cached)

    fits = (start >= 0) & (start <= size - length)
    if length * sum(rows.shape[1] for rows in cached) <= SMALL_RUN_VALUES:
        # Few rows: both sources (slices alone) cost less than a conditional under XLA.
        chosen = zip(sliced(), computed(), strict=True)
        return finish(tuple(ops.where(fits, a, b) for a, b in chosen))
    # The computed rows must not fuse into `finish`: XLA would compute them again for every
    # batch row and head. A conditional is a fusion boundary (as `_tf.choose_at_run_time`:
    # XLA:CPU drops an optimization barrier before fusing), so they come out of one.
    computed_once = lambda: ops.cond(start >= 0, computed, computed)  # noqa: E731
    return ops.cond(fits, lambda: finish(sliced()), lambda: finish(computed_once()))


def _symbolic_run(table: PositionTable, make, start, length) -> tuple:
    """The rows of a run of a symbolic length (`jax.export`; `start` a traced int32), by
    gathers (a slice's size must be known to fit its table): the cached rows while the run
    fits them, else the split rows, chosen at run time.

    Both are the rows eager and `jax.jit` calls give: inside the cached rows the split
    rows equal them bitwise (coarse row 0 is sin 0, cos 1: the products give the fine row,
    FMA or not), so the choice is for speed, one gather instead of four and the products.
    The conditional also keeps the rows from fusing into `finish`, where XLA would compute
    them again for every batch row and head (measured against `jax.jit` on the rotary
    8x512x8x64 of `python -m benchmarks --backend jax`, 2-core CPU: 2.0-2.7x the time
    without it, 1.2-1.5x with it).
    """
    positions = ops.clip(ops.arange(length, dtype="int32") + start, 0, table.limit - 1)

    def cached():
        steps = ops.minimum(positions, CACHED_POSITIONS - 1)
        return tuple(ops.take(rows, steps, axis=0) for rows in table.cached)

    def computed():
        return tuple(make(*kops.split_sin_cos(table.frequencies, positions)))

    fits = (start >= 0) & (start <= CACHED_POSITIONS - ops.convert_to_tensor(length, "int32"))
    return ops.cond(fits, cached, computed)


def _variable_run(table, start, length: int) -> tuple:
    """A run of a learned table: no rows past it, so a bad traced run takes clamped rows."""
    size, width = table.shape
    if isinstance(start, int):
        return (ops.slice(table, (start, 0), (length, width)),)
    if kops.is_symbolic(length) or length > size:
        steps = ops.clip(ops.arange(length, dtype="int32") + start, 0, size - 1)
        return (ops.take(table, steps, axis=0),)
    first = ops.clip(start, 0, size - length)
    return (ops.slice(table, (first, 0), (length, width)),)
