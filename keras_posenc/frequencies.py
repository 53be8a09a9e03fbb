"""The shared frequency table: `sin` and `cos` of `position * ω` for every layer.

Angles `position * ω` lose float32 precision as the position grows (an error of 6e-2 at
position 1e6), so nothing here forms an angle in float32. Every value comes from a table
computed in float64 on the host and rounded once to float32:

- the first `CACHED_POSITIONS` rows are held whole, in the layout a layer adds or
  multiplies with, so the common case (a contiguous run from a small `start_index`) is one
  slice of a ready table;
- any position below `MAX_POSITIONS` is exact through the split `i = a + b`, with `a` a
  multiple of `CACHED_POSITIONS`:
  `sin(iω) = sin(aω)cos(bω) + cos(aω)sin(bω)`, `cos(iω) = cos(aω)cos(bω) - sin(aω)sin(bω)`,
  two gathers from two small tables and float32 products (error below 2e-7).

Inside a graph there are only gathers, slices and float32 arithmetic: no float64 (TPUs have
none) and no sin/cos recomputed per call.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable, Sequence

import numpy as np
from keras import ops

from keras_posenc.backend.lazy import tricks
from keras_posenc.layers.checks import (
    checked_choice,
    checked_even_width,
    checked_max_wavelength,
)
from keras_posenc.tables.host_constant import HostConstant
from keras_posenc.tables.rows import TableRows, as_rows  # noqa: F401  as_rows: re-exported

CACHED_POSITIONS = 4096
MAX_POSITIONS = CACHED_POSITIONS * CACHED_POSITIONS  # 16,777,216
FREQUENCY_SPACINGS = ("vaswani", "tensor2tensor")


def inverse_frequencies(
    dim: int, max_wavelength: float = 10000.0, spacing: str = "vaswani"
) -> np.ndarray:
    """The `dim // 2` frequencies `ω_k` of `dim` channels, in float64.

    Args:
        dim: the number of channels the frequencies serve (even; two per frequency).
        max_wavelength: the base; the longest wavelength is about `2π·max_wavelength`.
        spacing: `"vaswani"`, `ω_k = max_wavelength^(-2k/dim)` (Vaswani et al. 2017, RoPE);
            or `"tensor2tensor"`, `ω_k = max_wavelength^(-k/(dim/2 - 1))`, whose last
            frequency is exactly `1/max_wavelength` (tensor2tensor, fairseq, Whisper).

    Returns:
        A float64 numpy array of shape `(dim // 2,)`.
    """
    dim = checked_even_width(dim, "dim")
    max_wavelength = checked_max_wavelength(max_wavelength)
    checked_choice("frequency spacing", spacing, FREQUENCY_SPACINGS)
    if spacing == "vaswani":
        return max_wavelength ** (-np.arange(0, dim, 2, dtype=np.float64) / dim)
    # tensor2tensor's get_timing_signal_1d: log-spaced from 1 to 1/max_timescale, with
    # max(num_timescales - 1, 1) steps (one frequency pair is just 1).
    pairs = dim // 2
    return max_wavelength ** (-np.arange(pairs, dtype=np.float64) / max(pairs - 1, 1))


def lookup_sin_cos(positions, fine_sin, fine_cos, coarse_sin, coarse_cos) -> tuple:
    """`(sin, cos)` of `positions * ω` from the two-table split, shape `positions.shape + (dim/2,)`.

    `fine_*` hold rows `b = 0 .. CACHED_POSITIONS - 1`, `coarse_*` rows
    `a = 0, CACHED_POSITIONS, 2·CACHED_POSITIONS, ...`; positions must lie in
    `[0, MAX_POSITIONS)` (callers clamp them and poison the rows of those that do not).
    """
    take = tricks().take
    positions = ops.cast(positions, "int32")
    coarse = positions // CACHED_POSITIONS
    fine = positions - coarse * CACHED_POSITIONS
    sin_a = take(coarse_sin, coarse, 0)
    cos_a = take(coarse_cos, coarse, 0)
    sin_b = take(fine_sin, fine, 0)
    cos_b = take(fine_cos, fine, 0)
    return sin_a * cos_b + cos_a * sin_b, cos_a * cos_b - sin_a * sin_b


class FrequencyTable:
    """`scale·sin(position·ω)` and `scale·cos(position·ω)` for positions in `[0, MAX_POSITIONS)`.

    Args:
        inverse_frequencies: float64 array of `ω`, shape `(dim // 2,)`.
        scale: multiplies every value (RoPE's attention factor); 1 for plain sin/cos.
    """

    def __init__(self, inverse_frequencies: np.ndarray, scale: float = 1.0):
        self.inverse_frequencies = np.asarray(inverse_frequencies, dtype=np.float64)
        self.scale = float(scale)

    def host_sin_cos(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Exact float64 `(scale·sin, scale·cos)` on the host: the one place angles are formed."""
        angles = np.multiply.outer(
            np.asarray(positions, dtype=np.float64), self.inverse_frequencies
        )
        return self.scale * np.sin(angles), self.scale * np.cos(angles)

    @functools.cached_property
    def split_tables(self) -> tuple[HostConstant, ...]:
        """The four float32 tables of the split (fine sin, fine cos, coarse sin, coarse cos)
        that every backend's rows are computed from."""
        # The scale goes into the fine half only: the products then carry it exactly once.
        fine = self.host_sin_cos(np.arange(CACHED_POSITIONS))
        coarse = FrequencyTable(self.inverse_frequencies).host_sin_cos(
            np.arange(0, MAX_POSITIONS, CACHED_POSITIONS)
        )
        return tuple(HostConstant(a.astype(np.float32)) for a in (*fine, *coarse))

    def sin_cos(self, positions, below: int | None = None) -> tuple:
        """float32 `(sin, cos)` for integer `positions` (any shape, in `[0, MAX_POSITIONS)`).

        `below`: the positions are known to be below it (an export's bound), so only the
        coarse rows below it are needed.
        """
        t = tricks()
        traced = t.is_traced(positions)
        lookup = t.one_call_eagerly(lookup_sin_cos)
        fine_sin, fine_cos, coarse_sin, coarse_cos = self.split_tables
        if below is None:
            coarse = (coarse_sin.tensor(traced), coarse_cos.tensor(traced))
        else:
            rows = -(-below // CACHED_POSITIONS)
            coarse = (coarse_sin.rows(0, rows, traced), coarse_cos.rows(0, rows, traced))
        return lookup(positions, fine_sin.tensor(traced), fine_cos.tensor(traced), *coarse)


# `(sin, cos) -> rows`: of the backend's tensors (`make_rows`), or of float64 numpy arrays
# (`make_host_rows`).
RowMaker = Callable[..., Sequence]


class PositionTable(TableRows):
    """Per-position rows of `(sin, cos)`, ready for the first `CACHED_POSITIONS` positions.

    `make_host_rows` turns the float64 host `(sin, cos)` of shape `(..., dim/2)` into the
    tables a layer combines with its input (for example the interleaved encoding, or
    RoPE's cos and signed sin; numpy, `keras_posenc.tables.layouts`), rounded once to float32 for
    the cached rows. `make_rows` lays out the exact float32 values the graphs compute for
    positions past the cache, the same way (in the backend's ops: `tricks().encoding`,
    `channel_tables`). Which rows serve a run or some positions (`slice`, `gather`) is
    decided in `keras_posenc.tables.rows`.
    """

    limit = MAX_POSITIONS

    def __init__(self, frequencies: FrequencyTable, make_rows: RowMaker, make_host_rows: RowMaker):
        self.frequencies = frequencies
        self.make_rows = make_rows
        self.make_host_rows = make_host_rows
        super().__init__(HostConstant(a) for a in self._host_rows(np.arange(CACHED_POSITIONS)))

    def _host_rows(self, positions: np.ndarray) -> tuple[np.ndarray, ...]:
        """float32 rows of `positions`, from the float64 host values rounded once."""
        rows = self.make_host_rows(*self.frequencies.host_sin_cos(positions))
        return tuple(np.asarray(a, np.float64).astype(np.float32) for a in rows)

    @property
    def cached(self) -> tuple[np.ndarray, ...]:
        return tuple(rows.array for rows in self.ready)

    def stored_arrays(self, bound: int | None = None) -> dict[str, np.ndarray]:
        """The host arrays of this table an export holds as constants, by name.

        `bound`: the export's largest position + 1 (None: no bound). Within the cache
        (`bound <= CACHED_POSITIONS`) only the cached rows below it; otherwise every
        cached row (`cached_0`, ...) and the split tables that serve positions past them:
        the fine rows whole, the coarse rows below the bound (views, not copies).
        """
        named = {f"cached_{i}": array for i, array in enumerate(self.cached)}
        if bound is not None and bound <= CACHED_POSITIONS:
            return {name: array[:bound] for name, array in named.items()}
        fine_sin, fine_cos, coarse_sin, coarse_cos = self.frequencies.split_tables
        coarse_rows = None if bound is None else -(-bound // CACHED_POSITIONS)
        named.update(
            fine_sin=fine_sin.array,
            fine_cos=fine_cos.array,
            coarse_sin=coarse_sin.array[:coarse_rows],
            coarse_cos=coarse_cos.array[:coarse_rows],
        )
        return named

    def computed(self, positions, below: int | None) -> tuple:
        return tuple(self.make_rows(*self.frequencies.sin_cos(positions, below=below)))

    def computed_run(self, start, length, top: int, below: int | None) -> tuple:
        sin_cos = tricks().run_sin_cos(self.frequencies, start, length, top, below)
        return tuple(self.make_rows(*sin_cos))

    def host_run(self, start: int, length: int) -> tuple:
        host = functools.cache(lambda: self._host_rows(np.arange(start, start + length)))
        return tuple(
            tricks().traced_constant(self, ("computed", start, length, i), lambda i=i: host()[i])
            for i in range(len(self.ready))
        )


# Tables shared by every live layer of one configuration; a table no layer holds is freed.
_position_tables: weakref.WeakValueDictionary[tuple, PositionTable] = weakref.WeakValueDictionary()


def held_tables(rows) -> tuple[PositionTable, ...]:
    """`(rows,)` when a layer's `rows` are a `PositionTable`, else `()` (rows made otherwise:
    several axes, or a switch between tables by length)."""
    return (rows,) if isinstance(rows, PositionTable) else ()


def position_table(key: tuple, build: Callable[[], PositionTable]) -> PositionTable:
    """The `PositionTable` cached under `key`, shared by every layer with that configuration.

    `build` makes it the first time; later layers reuse the host arrays (and their eager
    tensors) instead of computing them again. The cache holds tables only while a layer
    does, so building layers of many configurations does not keep their tables forever.
    """
    table = _position_tables.get(key)
    if table is None:
        table = build()
        _position_tables[key] = table
    return table
