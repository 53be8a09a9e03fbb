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
from collections.abc import Callable, Sequence

import numpy as np
import tensorflow as tf
from tensorflow.compiler.tf2xla.python import xla
from tensorflow.python.ops import control_flow_util

CACHED_POSITIONS = 4096
MAX_POSITIONS = CACHED_POSITIONS * CACHED_POSITIONS  # 16,777,216


def inverse_frequencies(dim: int, max_wavelength: float = 10000.0) -> np.ndarray:
    """`ω_k = max_wavelength^(-2k/dim)` for `k = 0 .. dim/2 - 1`, in float64.

    Args:
        dim: the number of channels the frequencies serve (even; two per frequency).
        max_wavelength: the base; the longest wavelength is about `2π·max_wavelength`.

    Returns:
        A float64 numpy array of shape `(dim // 2,)`.
    """
    dim = checked_even_width(dim, "dim")
    max_wavelength = checked_max_wavelength(max_wavelength)
    return max_wavelength ** (-np.arange(0, dim, 2, dtype=np.float64) / dim)


def accumulation_dtype(dtype) -> tf.DType:
    """The dtype a layer combines its input with its tables in: float32 or wider.

    float16 / bfloat16 inputs are widened so that the result is rounded once, when it is
    cast back to the input dtype; float32 and float64 inputs are used as they are.
    """
    dtype = tf.as_dtype(dtype)
    return dtype if dtype.size >= 4 else tf.float32


def add_rounded_once(inputs: tf.Tensor, rows: tf.Tensor) -> tf.Tensor:
    """`inputs + rows` in `accumulation_dtype(inputs.dtype)`, cast back: rounded once."""
    wide = accumulation_dtype(inputs.dtype)
    return tf.cast(tf.cast(inputs, wide) + tf.cast(rows, wide), inputs.dtype)


def checked_even_width(width, name: str = "width") -> int:
    """`width` as a positive even int, or a ValueError that says why it must be."""
    if isinstance(width, bool) or not isinstance(width, (int, np.integer)) or width <= 0:
        raise ValueError(f"{name} must be a positive even integer, got {width!r}.")
    if width % 2:
        raise ValueError(
            f"{name} must be even (channels come in sin/cos pairs), got {width}. Use an even width."
        )
    return int(width)


def checked_max_wavelength(max_wavelength) -> float:
    """`max_wavelength` as a float > 1, or a ValueError."""
    try:
        value = float(max_wavelength)
    except (TypeError, ValueError):
        value = float("nan")
    if not np.isfinite(value) or value <= 1.0:
        raise ValueError(
            f"max_wavelength must be a finite number > 1, got {max_wavelength!r} "
            "(10000.0 is the usual value)."
        )
    return value


def checked_choice(name: str, value, choices: Sequence[str]) -> str:
    """`value` if it is one of `choices`, else a ValueError listing them."""
    if value not in choices:
        raise ValueError(f"Unknown {name} {value!r}; expected one of {tuple(choices)}.")
    return value


class HostConstant:
    """A host array that becomes a graph constant when traced and a cached tensor eagerly.

    A `tf.constant` made eagerly and captured by a traced function turns into an extra,
    unfeedable input of an exported ONNX graph; one made while tracing is a plain
    constant node. Eager calls reuse one tensor instead of copying the array every call.
    """

    def __init__(self, array: np.ndarray):
        self.array = array
        self._eager_tensor = None

    def tensor(self) -> tf.Tensor:
        if tf.executing_eagerly():
            if self._eager_tensor is None:
                self._eager_tensor = tf.constant(self.array)
            return self._eager_tensor
        return tf.constant(self.array)


@tf.function(autograph=False, reduce_retracing=True)
def lookup_sin_cos(
    positions: tf.Tensor,
    fine_sin: tf.Tensor,
    fine_cos: tf.Tensor,
    coarse_sin: tf.Tensor,
    coarse_cos: tf.Tensor,
) -> tuple[tf.Tensor, tf.Tensor]:
    """`(sin, cos)` of `positions * ω` from the two-table split, shape `positions.shape + (dim/2,)`.

    `fine_*` hold rows `b = 0 .. CACHED_POSITIONS - 1`, `coarse_*` rows
    `a = 0, CACHED_POSITIONS, 2·CACHED_POSITIONS, ...`; positions must lie in
    `[0, MAX_POSITIONS)` (callers check).
    """
    positions = tf.cast(positions, tf.int32)
    coarse = positions // CACHED_POSITIONS
    fine = positions - coarse * CACHED_POSITIONS
    sin_a = tf.gather(coarse_sin, coarse)
    cos_a = tf.gather(coarse_cos, coarse)
    sin_b = tf.gather(fine_sin, fine)
    cos_b = tf.gather(fine_cos, fine)
    return sin_a * cos_b + cos_a * sin_b, cos_a * cos_b - sin_a * sin_b


def in_xla_context() -> bool:
    """Whether the graph being traced will be compiled by XLA (`jit_compile=True`)."""
    return control_flow_util.GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph())


def int_array(values) -> np.ndarray | list:
    """`values` as an int32 numpy array when they are all Python ints, else unchanged.

    Given a Python list, an eager op leaves TensorFlow's fast path for a slow conversion
    (about 100 µs, 5x the op itself); given a numpy array it stays on it.
    """
    if all(isinstance(v, (int, np.integer)) for v in values):
        return np.asarray(values, dtype=np.int32)
    return values


def _dynamic_rows(table: tf.Tensor, start: tf.Tensor, length) -> tf.Tensor:
    """Rows `start .. start + length - 1` by XLA's DynamicSlice, with its gradient.

    TensorFlow registers no gradient for XlaDynamicSlice; a learned table trained under
    XLA with a runtime start needs one: the upstream rows, put back where they came from.
    """
    begin = tf.stack([start, 0])

    @tf.custom_gradient
    def rows(table):
        def gradient(upstream):
            return xla.dynamic_update_slice(tf.zeros_like(table), upstream, begin)

        return xla.dynamic_slice(table, begin, [length, table.shape[1]]), gradient

    return rows(table)


def slice_rows(table: tf.Tensor, start, length) -> tf.Tensor:
    """Rows `start .. start + length - 1` of `table`; `start` an int or a scalar int32 tensor."""
    if not isinstance(start, (int, np.integer)) and in_xla_context():
        # tf.slice makes its start a compile-time constant under XLA (one compilation per
        # decoding step). XLA's own dynamic slice takes it at run time and fuses with its
        # consumer; a gather does too, but from a table of 1 MiB or more it costs XLA:CPU
        # about 55 µs more per call (1.3x the floor on small inputs). Keras's TensorFlow
        # backend imports this module as well. The dynamic slice needs a length known when
        # tracing (XLA checks it against the table even in an untaken branch); a length
        # known only when compiling takes the gather.
        if isinstance(length, (int, np.integer)):
            return _dynamic_rows(table, start, length)
        return tf.gather(table, tf.range(length) + start)
    # Outside XLA a slice of leading rows shares the table's memory: no copy.
    return tf.slice(table, int_array([start, 0]), int_array([length, -1]))


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
    def _split_tables(self) -> tuple[HostConstant, ...]:
        # The scale goes into the fine half only: the products then carry it exactly once.
        fine = self.host_sin_cos(np.arange(CACHED_POSITIONS))
        coarse = FrequencyTable(self.inverse_frequencies).host_sin_cos(
            np.arange(0, MAX_POSITIONS, CACHED_POSITIONS)
        )
        return tuple(HostConstant(t.astype(np.float32)) for t in (*fine, *coarse))

    def sin_cos(self, positions: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        """float32 `(sin, cos)` for integer `positions` (any shape, in `[0, MAX_POSITIONS)`)."""
        return lookup_sin_cos(positions, *(t.tensor() for t in self._split_tables))


def _split(x: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    # Veltkamp: x = high + low with 12 significant bits each, so the product of any two
    # halves is exact in float32 (no rounding, and no change if fused into an FMA).
    scaled = x * 4097.0
    high = scaled - (scaled - x)
    return high, x - high


_TURN = 2**31  # one turn in the fixed-point sum below


def exact_sin_cos(positions: tf.Tensor, turns: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """`(sin, cos)` of `2π · positions · turns` for float32 `turns` known only at run time.

    For frequencies made inside the graph (dynamic NTK scaling), where no host table can
    exist. `turns` is the frequency in turns per position (`ω / 2π`). The product
    `position · turns` is never rounded: it is the sum of four exact float32 products of
    12-bit halves, each reduced to a fraction of a turn and added in 64-bit fixed point
    (integer arithmetic, which no graph optimizer can reorder). The only roundings are of
    the final angle in `[-π, π)` and of sin/cos: about 3e-7 at any position below 2^24.

    Args:
        positions: integer tensor, any shape, values in `[0, 2^24)`.
        turns: float32 tensor `(dim/2,)`.

    Returns:
        float32 `(sin, cos)`, each of shape `positions.shape + (dim/2,)`.
    """
    turns_high, turns_low = _split(tf.cast(turns, tf.float32))
    # expand_dims, not [..., None]: tf2onnx needs ranks for the latter, and inside a
    # conditional's branch it does not know them.
    positions = tf.expand_dims(tf.cast(positions, tf.int32), -1)
    position_low = positions % 4096
    position_high = tf.cast(positions - position_low, tf.float32)  # 12 significant bits
    position_low = tf.cast(position_low, tf.float32)
    fixed = tf.zeros([], tf.int64)
    for position_part in (position_high, position_low):
        for turns_part in (turns_high, turns_low):
            product = position_part * turns_part  # exact
            fraction = product - tf.round(product)  # exact, in [-0.5, 0.5]
            fixed += tf.cast(tf.round(fraction * _TURN), tf.int64)
    half = _TURN // 2
    wrapped = tf.math.floormod(fixed + half, _TURN) - half  # [-half turn, half turn)
    angle = tf.cast(wrapped, tf.float32) * np.float32(2.0 * np.pi / _TURN)
    return tf.sin(angle), tf.cos(angle)


Layout = Callable[[tf.Tensor, tf.Tensor], Sequence[tf.Tensor]]


def as_rows(*rows: tf.Tensor) -> tuple[tf.Tensor, ...]:
    """The rows themselves: the default `combine` of `PositionTable.slice`."""
    return rows


class PositionTable:
    """Per-position rows `layout(sin, cos)`, ready for the first `CACHED_POSITIONS` positions.

    `layout` turns `(sin, cos)` of shape `(..., dim/2)` into the tables a layer combines
    with its input (for example the interleaved encoding, or RoPE's cos and signed sin).
    It runs once on the float64 host values to build the cache (one rounding), and in
    the graph on exact float32 values for positions past the cache.
    """

    def __init__(self, frequencies: FrequencyTable, layout: Layout):
        self.frequencies = frequencies
        self.layout = layout
        with tf.init_scope():
            host = [tf.constant(t) for t in frequencies.host_sin_cos(np.arange(CACHED_POSITIONS))]
            self._cached = tuple(HostConstant(t.numpy().astype(np.float32)) for t in layout(*host))

    @property
    def cached(self) -> tuple[np.ndarray, ...]:
        return tuple(t.array for t in self._cached)

    def gather(self, positions: tf.Tensor) -> tuple[tf.Tensor, ...]:
        """Rows for integer `positions` of any shape."""
        return tuple(self.layout(*self.frequencies.sin_cos(positions)))

    def slice(self, start, length, combine=as_rows):
        """`combine(*rows)` for positions `start .. start + length - 1` (ints or int32 scalars).

        `combine` is what the caller makes of the rows (`inputs + rows`, a rotation). When
        the choice between cache and computation waits for a runtime `start` under XLA, it
        runs inside each branch, so that XLA fuses the row lookup into it: rows returned by
        a conditional are written out whole and read back (1.5x the floor at 4096 x 1024).
        Elsewhere the cond returns the rows (by reference, no copy) and `combine` follows:
        converters such as tf2onnx cannot infer shapes inside the branches.
        """
        # Python ints stay Python ints (tf.is_tensor and get_static_value are slow on them).
        static = isinstance(start, (int, np.integer)) and isinstance(length, (int, np.integer))

        def from_cache():
            # Clamped so that the untaken branch of the cond below stays a valid slice.
            first = start if static else tf.minimum(start, CACHED_POSITIONS - length)
            return tuple(slice_rows(t.tensor(), first, length) for t in self._cached)

        def computed():
            return self.gather(tf.range(length) + start)

        if static:
            fits = start + length <= CACHED_POSITIONS
        elif isinstance(length, (int, np.integer)) and length > CACHED_POSITIONS:
            fits = False  # whatever the start (and XLA rejects a slice longer than the table)
        else:
            fits = tf.get_static_value(start <= CACHED_POSITIONS - length)
        if fits is not None:
            return combine(*(from_cache() if fits else computed()))
        cached = start <= CACHED_POSITIONS - length  # a sum could wrap around in int32
        if in_xla_context():
            # The computed rows must not fuse into `combine`: XLA would compute them again
            # for every batch row and head (2-3x the floor). A conditional is a fusion
            # boundary (XLA:CPU expands its optimization-barrier op away before fusing), so
            # they come out of one, written once.
            def computed_once():
                return tf.cond(start >= 0, computed, computed)

            return tf.cond(
                cached, lambda: combine(*from_cache()), lambda: combine(*computed_once())
            )
        return combine(*tf.cond(cached, from_cache, computed))


_position_tables: dict[tuple, PositionTable] = {}


def position_table(key: tuple, build: Callable[[], PositionTable]) -> PositionTable:
    """The `PositionTable` cached under `key`, shared by every layer with that configuration.

    `build` makes it the first time; later layers reuse the host arrays (and their eager
    tensors) instead of computing them again.
    """
    table = _position_tables.get(key)
    if table is None:
        table = _position_tables[key] = build()
    return table
