"""How far a float32 evaluation can be from the exact answer: the tolerance the tests allow.

XLA and Eigen order, vectorise and fuse float32 sums differently on every CPU, so a
tolerance tuned until it passed on one machine fails on the next. Instead, the float64
references carry beside each value the largest difference that any float32 evaluation of
the same formula can have from it, by the standard forward error bounds (Higham, *Accuracy
and Stability of Numerical Algorithms*, 2nd ed., §2.2 and §3.1):

- one rounding: `|fl(a op b) - (a op b)| <= u |a op b|`, `u = 2^-24`;
- a dot product of length `n`, summed in any order, with or without FMA:
  `|fl(x·y) - x·y| <= γ_n |x|·|y|`, `γ_n = n u / (1 - n u)`;
- `exp` from a library within `EXP_ULPS` units in the last place;
- a position table entry within `TABLE_ERROR` (the package rounds each once, and joins the
  split `sin((a+b)ω) = sin(aω)cos(bω) + cos(aω)sin(bω)` with two products and a sum).

Errors already in the operands are carried along exactly (intervals, not first order), so a
bound holds for every summation order: a guarantee, not a fit. Worst-case bounds are a few
times larger than the errors seen; they are still orders of magnitude below what a wrong
position, table row, scaling or mask gives (1e-3 and more in these tests).

`Bounded` works inside the plain numpy references of `reference.py` (numpy dispatches
`np.einsum`, `np.where`, `np.exp`, ... to it), so one formula gives the value and its bound.
"""

from __future__ import annotations

import math

import numpy as np

U = 2.0**-24  # float32's unit roundoff
EXP_ULPS = 4  # Eigen's and XLA's float32 exp are within 1-2 ulp; 4 leaves room
TABLE_ERROR = 6 * U  # the split's two once-rounded products and their sum, for |entries| <= 1


def gamma(n: int) -> float:
    """`γ_n`: the relative error bound of `n` float32 operations in sequence."""
    return n * U / (1 - n * U)


class Bounded:
    """A float64 value and the most a float32 evaluation of it can be off, per element."""

    __array_priority__ = 1000  # `array op Bounded` calls Bounded's operators

    def __init__(self, value, error=None):
        self.value = np.asarray(value, np.float64)
        if error is None:  # an input: exact when float32 holds it, else rounded once
            with np.errstate(invalid="ignore"):  # inf - inf
                error = np.abs(self.value - self.value.astype(np.float32))
            error = np.where(np.isfinite(self.value), error, 0.0)
        self.error = np.array(np.broadcast_to(np.asarray(error, np.float64), self.value.shape))

    # --- the array interface the references use -----------------------------------------

    shape = property(lambda self: self.value.shape)
    ndim = property(lambda self: self.value.ndim)

    def __getitem__(self, index) -> Bounded:
        return Bounded(self.value[index], self.error[index])

    def __setitem__(self, index, other) -> None:
        other = bounded(other)
        self.value[index] = other.value
        self.error[index] = other.error

    def copy(self) -> Bounded:
        return Bounded(self.value.copy(), self.error.copy())

    def reshape(self, *shape) -> Bounded:
        return Bounded(self.value.reshape(*shape), self.error.reshape(*shape))

    def max(self, axis=None, keepdims=False) -> Bounded:
        # The float32 maximum is one of the float32 elements: off by at most their largest error.
        return Bounded(
            self.value.max(axis=axis, keepdims=keepdims),
            self._finite_error().max(axis=axis, keepdims=keepdims),
        )

    def sum(self, axis=None, keepdims=False) -> Bounded:
        n = self.value.size if axis is None else self.value.shape[axis]
        carried = self.error.sum(axis=axis, keepdims=keepdims)
        magnitude = self._magnitude().sum(axis=axis, keepdims=keepdims)
        total = self.value.sum(axis=axis, keepdims=keepdims)
        return Bounded(total, carried + gamma(max(n - 1, 1)) * magnitude)

    @property
    def magnitude(self) -> np.ndarray:
        """The largest `|float32 value|` the bound admits."""
        return self._magnitude()

    def _magnitude(self) -> np.ndarray:
        return np.abs(self.value) + self.error

    def _finite_error(self) -> np.ndarray:
        return np.where(np.isfinite(self.value), self.error, 0.0)

    # --- arithmetic, each operation rounded once --------------------------------------------

    def __add__(self, other) -> Bounded:
        other = bounded(other)
        total = self.value + other.value
        carried = self.error + other.error
        with np.errstate(invalid="ignore"):
            error = carried + U * (np.abs(total) + carried)
        return Bounded(total, np.where(np.isfinite(total), error, 0.0))

    __radd__ = __add__

    def __neg__(self) -> Bounded:
        return Bounded(-self.value, self.error)

    def __sub__(self, other) -> Bounded:
        return self + (-bounded(other))

    def __rsub__(self, other) -> Bounded:
        return bounded(other) + (-self)

    def __mul__(self, other) -> Bounded:
        other = bounded(other)
        exact = np.abs(self.value) * np.abs(other.value)
        carried = self._magnitude() * other._magnitude()
        return Bounded(self.value * other.value, (1 + U) * carried - exact)

    __rmul__ = __mul__

    def __truediv__(self, other) -> Bounded:
        other = bounded(other)
        low = np.abs(other.value) - other.error  # the denominator keeps its sign: |b| > error
        assert not (low <= 0).any(), "the bound admits a zero denominator"
        value = self.value / other.value
        carried = (self.error * np.abs(other.value) + np.abs(self.value) * other.error) / (
            np.abs(other.value) * low
        )
        # A division, or a reciprocal and a product: two roundings.
        return Bounded(value, carried + 2 * U * self._magnitude() / low)

    # --- numpy's dispatch ---------------------------------------------------------------

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        if ufunc is np.exp and method == "__call__" and not kwargs:
            return _exp(inputs[0])
        return NotImplemented

    def __array_function__(self, function, types, args, kwargs):
        if function not in _FUNCTIONS:
            return NotImplemented
        return _FUNCTIONS[function](*args, **kwargs)


def bounded(x) -> Bounded:
    """`x` as a `Bounded` (a plain number or array: an input, see `Bounded`)."""
    return x if isinstance(x, Bounded) else Bounded(x)


def _exp(x: Bounded) -> Bounded:
    value = np.exp(x.value)
    with np.errstate(over="ignore", invalid="ignore"):
        error = value * (np.exp(x.error) * (1 + 2 * EXP_ULPS * U) - 1)
    # exp(-inf): a blocked score, exactly 0 in float32 too (Keras adds a huge negative).
    return Bounded(value, np.where(np.isneginf(x.value), 0.0, error))


def _einsum(spec: str, a, b) -> Bounded:
    a, b = bounded(a), bounded(b)
    inputs, output = spec.replace(" ", "").split("->")
    left, right = inputs.split(",")
    sizes = dict(zip(left, a.shape, strict=True)) | dict(zip(right, b.shape, strict=True))
    n = math.prod(sizes[index] for index in set(left + right) - set(output))
    exact = np.einsum(spec, np.abs(a.value), np.abs(b.value))
    carried = np.einsum(spec, a.magnitude, b.magnitude)
    return Bounded(np.einsum(spec, a.value, b.value), (1 + gamma(n)) * carried - exact)


def _where(condition, x, y) -> Bounded:
    x, y = bounded(x), bounded(y)
    return Bounded(np.where(condition, x.value, y.value), np.where(condition, x.error, y.error))


def _moveaxis(x: Bounded, source, destination) -> Bounded:
    return Bounded(
        np.moveaxis(x.value, source, destination), np.moveaxis(x.error, source, destination)
    )


def _repeat(x: Bounded, repeats, axis=None) -> Bounded:
    return Bounded(np.repeat(x.value, repeats, axis), np.repeat(x.error, repeats, axis))


def _concatenate(arrays, axis=0) -> Bounded:
    arrays = [bounded(a) for a in arrays]
    return Bounded(
        np.concatenate([a.value for a in arrays], axis),
        np.concatenate([a.error for a in arrays], axis),
    )


_FUNCTIONS = {
    np.einsum: _einsum,
    np.where: _where,
    np.moveaxis: _moveaxis,
    np.repeat: _repeat,
    np.concatenate: _concatenate,
}


def table(values) -> Bounded:
    """Position table entries (cos or sin, times an attention factor) as the package stores them."""
    values = np.asarray(values, np.float64)
    return Bounded(values, TABLE_ERROR * np.maximum(np.abs(values).max(initial=0.0), 1.0))


def assert_within(actual, expected: Bounded, where=None) -> None:
    """Assert every element of the float32 result `actual` lies within `expected`'s bound.

    `where`: optional boolean mask of the elements to compare (the others are undefined).
    """
    _assert_at_most(np.abs(np.asarray(actual, np.float64) - expected.value), expected.error, where)


def assert_agree(a, b, expected: Bounded, where=None) -> None:
    """Assert two float32 evaluations of what `expected` bounds agree: within twice its bound."""
    difference = np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))
    _assert_at_most(difference, 2 * expected.error, where)


def _assert_at_most(error: np.ndarray, bound: np.ndarray, where) -> None:
    error, bound = np.broadcast_arrays(error, bound)
    if where is not None:
        error, bound = error[where], bound[where]
    outside = ~(error <= bound)  # NaN is outside
    assert not outside.any(), (
        f"{outside.sum()} of {outside.size} values outside their float32 bound: worst "
        f"{np.nanmax(error / np.maximum(bound, 1e-300)):.3g} times the bound, max error "
        f"{np.nanmax(error):.3g} (bound there {bound.flat[np.nanargmax(error)]:.3g})"
    )


def worst_fraction(actual, expected: Bounded, where=None) -> float:
    """The largest `|actual - value| / bound`: how much of the bound a result uses."""
    error = np.abs(np.asarray(actual, np.float64) - expected.value)
    bound = expected.error
    if where is not None:
        error, bound = error[where], bound[where]
    return float(np.nanmax(error / np.maximum(bound, 1e-300)))


# --- attention as a whole: transformers' modules beside the package's layers ----------------

RSQRT_ULPS = 4  # rsqrt / 1 / sqrt within 2 ulp on Eigen, XLA and torch; 4 leaves room


def linear_error(x, kernel, bias=None, unit: float = U) -> np.ndarray:
    """Bound of `x @ kernel + bias` (kernel `(in, out)`) per output: `γ_{K+1}(|x||W| + |b|)`.

    `unit`: the unit roundoff (`U` for float32; `2.0**-53` for float64).
    """
    magnitude = np.abs(x) @ np.abs(kernel) + (0.0 if bias is None else np.abs(bias))
    return _gamma(kernel.shape[0] + 1, unit) * magnitude


def _gamma(n: int, unit: float) -> float:
    return n * unit / (1 - n * unit)


def assert_within_bound(actual, exact, bound, where=None, what: str = "") -> None:
    """Assert `|actual - exact| <= bound` elementwise (`where`: the elements compared;
    `what`: named in the message)."""
    try:
        _assert_at_most(np.abs(np.asarray(actual, np.float64) - exact), bound, where)
    except AssertionError as error:
        raise AssertionError(f"{what}: {error}" if what else str(error)) from None


def torch_table_error(max_position: float, scaled: bool = False) -> float:
    """How far transformers' float32 cos / sin tables are from the exact ones up to a position.

    torch forms `ω = 1 / base^(2k/d)` in float32: the exponent rounded (`u` of it, so
    `ln(1/ω) u` of `ω`), the power within 4 ulp, the division one rounding; then `p·ω` one
    rounding, so the angle is within `p ω (ln(1/ω) + 6) u <= p (1/e + 6) u` (`ω <= 1`), and
    cos / sin (1 ulp) times the attention factor (1 rounding) add `2u`: `(7p + 2) u`.
    `scaled`: a scaled RoPE (linear, llama3, YaRN, dynamic NTK) whose frequencies take up to
    16 more roundings of `ω` (llama3's smoothing, YaRN's blend) and its factor's own: `+16p u`.
    """
    return ((7 + (16 if scaled else 0)) * max_position + 2) * U


def rotation_error(x, table_error: float = TABLE_ERROR, factor: float = 1.0) -> np.ndarray:
    """Bound of one float32 RoPE of `x` (heads on the last axis), per element.

    Each output `a cos - b sin` of a pair: the table entries within `τ` each, two products
    and a sum: within `(τ + 3u)(|a| + |b|) <= 2 (τ + 3u) max|x|` over the head; tables
    times an attention factor `f >= 1` (entries up to `f`, `τ` relative to that): `f` times.
    """
    x = np.abs(np.asarray(x, np.float64))
    scale = 2 * max(factor, 1.0) * (table_error + 3 * U)
    return np.broadcast_to(scale * x.max(-1, keepdims=True), x.shape)


def torch_frequency_error(omega, scaled: bool = False) -> np.ndarray:
    """How far transformers' float32 RoPE frequencies can be from the exact `omega`.

    `1 / base^(2k/d)`: the exponent's rounding (`ln(1/ω) u` of `ω`), the power (4 ulp), the
    division and the final rounding to float32: `(ln(1/ω) + 6) u ω`; `scaled` (linear,
    llama3, YaRN, proportional...): up to 16 more roundings of `ω`. Zero stays zero.
    """
    omega = np.abs(np.asarray(omega, np.float64))
    with np.errstate(divide="ignore"):
        log = np.where(omega > 0, np.log(1 / np.where(omega > 0, omega, 1)), 0.0)
    return (np.maximum(log, 0) + 6 + (16 if scaled else 0)) * U * omega


def position_sum_error(x, table_error: float = TABLE_ERROR, table_magnitude: float = 1.0):
    """Bound of `x + table` in float32, the table's entries (`|t| <= table_magnitude`) within
    `table_error` of the exact ones: that error, then one rounding of the sum."""
    x = np.abs(np.asarray(x, np.float64))
    return table_error + U * (x + table_magnitude + table_error)


def table_dot_error(width: int, table_error: float = TABLE_ERROR, magnitude: float = 1.0):
    """Bound of a float32 dot product of two rows of `width` entries, each entry within
    `table_error` of the exact one and `|t| <= magnitude`: the operands' errors through the
    products, then `γ_width` of `Σ|a||b|`."""
    carried = width * (2 * table_error * magnitude + table_error**2)
    return carried + gamma(width) * width * (magnitude + table_error) ** 2


def score_and_bound(query, key, rotated_query, rotated_key) -> tuple[np.ndarray, np.ndarray]:
    """`Σ q k` of two float32 RoPE outputs and its bound from the exact rotations' score:
    each rotation within `rotation_error`, so `Σ (e_q |k| + |q| e_k + e_q e_k)` (`q`, `k`
    the float32 rotations: `q_32 k_32 - q k = e_q k_32 + q_32 e_k - e_q e_k`).

    `query`, `key`: the inputs (heads on the last axis); `rotated_*`: the float32 outputs.
    """
    query_error, key_error = rotation_error(query), rotation_error(key)
    value = np.sum(rotated_query * rotated_key, axis=-1)
    carried = query_error * np.abs(rotated_key) + np.abs(rotated_query) * key_error
    float64 = 2.0**-40 * np.sum(np.abs(rotated_query * rotated_key), axis=-1)  # its own sum
    return value, np.sum(carried + query_error * key_error, axis=-1) + float64
