"""Dynamic NTK's frequencies for a total length known only at run time, exact to 2^-44.

Past `max_position_embeddings` = M, with total length L, dynamic NTK turns pair `k` of `d`
channels by `ω'_k = ω_k · g^(-k/n)`, `g = factor·L/M - (factor - 1)`, `n = d/2 - 1`
(transformers raises the base to `base · g^(d/(d-2))`). A float32 `ω'` is off by its last
place, which times a position of 2^20 is an angle error of 1e-1; so the frequencies here
are two float32 words (`hi + lo`, 48 significant bits), and `tricks().exact_sin_cos` turns
them into angles without rounding the product.

Where L is known now (eagerly) the words are the host's float64 values, rounded once. In a
plain TensorFlow graph, which runs on a CPU or a GPU op by op, the same formula in float64
(a dozen ops). Under XLA (TPUs have no float64) and in converters' files they are made with
float32 arithmetic only, with error-free products (Veltkamp / Dekker) on two-word numbers
(a few hundred ops, which XLA fuses into a few kernels):

- `c0 = g^(-1/n)` in float32 (a few ulp off), and its powers `c0^k` as two words, exact
  to 2^-44, for every pair by repeated doubling (`c0^(2^b)`);
- one Newton step for `c^n · g = 1`: the residual `r = 1 - c0^n · g` in two words, then
  `c = c0 · (1 + r/n + (n+1) r²/(2n²))` (the first terms of `(1 - r)^(-1/n)`; `r` is a
  few 1e-6, so the rest is below 1e-16), and `c^k = c0^k · (1 + δ)^k` likewise.
"""

from __future__ import annotations

import functools
import math

import numpy as np
from keras import ops

from keras_posenc._lazy import tricks


def two_words(values) -> tuple[np.ndarray, np.ndarray]:
    """float64 `values` as float32 `(hi, lo)` with `hi + lo` within 2^-48 of them."""
    values = np.asarray(values, np.float64)
    high = values.astype(np.float32)
    return high, (values - high.astype(np.float64)).astype(np.float32)


def fixed_point_turns(high, low, round_, as_int32):
    """`high + low` (a frequency in turns, below 1) as `(whole, rest)`: `whole` an int32
    count of 2^-32 turns (modulo a turn: int32 arithmetic wraps at 2^32, one turn) and
    `rest` a float32 number of 2^-32 turns, `|rest| <= 1.5`.

    Roundings to whole numbers and scalings by powers of two: exact, and no product an FMA
    could change. `rest` is one sum, rounded once (2^-24 of a 2^-32 turn). The rotation
    `tricks().exact_sin_cos` multiplies a position by both; `round_` and `as_int32` are
    its backend's (round half to even; a cast of whole numbers).
    """
    high = high - round_(high)  # the fraction of a turn, in [-1/2, 1/2]: exact
    scaled_high = high * 2.0**31  # 2^-31 turns: an int32 even at half a turn
    whole_high = round_(scaled_high)
    scaled_low = low * 2.0**32  # |low| <= 2^-25: at most 2^7
    whole_low = round_(scaled_low)
    rest = (scaled_high - whole_high) * 2.0 + (scaled_low - whole_low)
    return as_int32(whole_high) * 2 + as_int32(whole_low), rest


def float64(value):
    """`value` as a float64 tensor (a Python number would take the backend's float type)."""
    return ops.convert_to_tensor(np.asarray(value, np.float64), "float64")


# Two-word arithmetic on float32 tensors (each op exact, or rounded once at 2^-48).


def _split(x):
    # Veltkamp: 12 significant bits each, so products of halves are exact in float32.
    scaled = x * 4097.0
    high = scaled - (scaled - x)
    return high, x - high


def _two_product(a, b):
    """`a·b` as two words `(p, e)`, `p + e` within 2^-48 of it.

    Made of exact products of halves only: XLA may fuse a product into the sum after it
    (an FMA), which changes nothing when the product is exact, but would change a rounded
    `a·b` in one place and not in another. Each sum pairs products with no factor in
    common: TensorFlow's graph optimizer turns `a_high·b_low + a_low·b_low` into `a·b_low`.
    """
    a_high, a_low = _split(a)
    b_high, b_low = _split(b)
    total, error = _two_sum(a_high * b_high, a_low * b_low)
    total, error_2 = _two_sum(total, a_high * b_low)
    total, error_3 = _two_sum(total, a_low * b_high)
    return total, (error + error_2) + error_3


def _quick_sum(a, b):
    """`a + b` as two words, for `|a| >= |b|` (Dekker's fast two-sum)."""
    total = a + b
    return total, b - (total - a)


def _two_sum(a, b):
    """`a + b` as two words, any order (Knuth)."""
    total = a + b
    b_part = total - a
    return total, (a - (total - b_part)) + (b - b_part)


def _multiply(x: tuple, y: tuple) -> tuple:
    """Two-word `x · y` (relative error below 2^-44)."""
    product, error = _two_product(x[0], y[0])
    return _quick_sum(product, error + (x[0] * y[1] + x[1] * y[0]))


class DynamicFrequencies:
    """Dynamic NTK's frequencies in turns per position (`ω'/2π`), as float32 `(hi, lo)`.

    Args:
        omega: float64 `ω` of the pairs (`d/2 >= 2` of them).
        factor: the scaling's factor.
        max_position_embeddings: M, the length past which the frequencies change.
    """

    def __init__(self, omega: np.ndarray, factor: float, max_position_embeddings: int):
        self.omega = np.asarray(omega, np.float64)
        self.factor = float(factor)
        self.max_position_embeddings = int(max_position_embeddings)
        self.pairs = len(self.omega)
        self.exponent = self.pairs - 1  # n: ω'_k = ω_k · g^(-k/n)
        self._turns = two_words(self.omega / (2 * math.pi))
        self._factor = two_words(self.factor)
        self._offset = two_words((self.factor - 1.0) * self.max_position_embeddings)

    def growth(self, total_length: int) -> float:
        """`g` for a total length (at least 1: M and shorter lengths keep `ω`)."""
        length = max(int(total_length), self.max_position_embeddings)
        return self.factor * length / self.max_position_embeddings - (self.factor - 1.0)

    def host_inverse_frequencies(self, total_length: int) -> np.ndarray:
        """float64 `ω'` for a total length known on the host."""
        return self.omega * self.growth(total_length) ** (-np.arange(self.pairs) / self.exponent)

    @functools.lru_cache(maxsize=64)  # noqa: B019  (one per layer configuration, few lengths)
    def host_turns(self, total_length: int) -> tuple[np.ndarray, np.ndarray]:
        """`(hi, lo)` of `ω'/2π` from the host's float64, rounded once."""
        return two_words(self.host_inverse_frequencies(total_length) / (2 * math.pi))

    def turns(self, total_length) -> tuple:
        """`(hi, lo)` float32 tensors `(d/2,)` of `ω'/2π` for the total length.

        A length known now gets the host's rows; a traced one, the two-word float32
        arithmetic, or float64 where the graph runs op by op (`tricks().dynamic_words`).
        """
        t = tricks()
        known = t.static_value(total_length)
        if known is not None and not t.is_symbolic(known) and np.ndim(known) == 0:
            return tuple(ops.convert_to_tensor(a) for a in self.host_turns(int(known)))
        return t.dynamic_words(
            lambda: self.traced_turns(total_length),
            lambda: self.float64_turns(total_length),
            total_length > self.max_position_embeddings,
            self._turns,  # the host's words of ω/2π: g = 1 at or below M
        )

    def float64_turns(self, total_length) -> tuple:
        """`turns` in float64 arithmetic, for a length known at run time: `host_turns`'
        formula, each step within a float64 rounding (2^-52), rounded to two words."""
        m = float(self.max_position_embeddings)
        length = ops.maximum(ops.cast(total_length, "float64"), float64(m))
        growth = float64(self.factor) * length / float64(m) - float64(self.factor - 1.0)
        exponents = float64(-np.arange(self.pairs) / self.exponent)
        turns = float64(self.omega / (2 * math.pi)) * ops.exp(exponents * ops.log(growth))
        high = ops.cast(turns, "float32")
        return high, ops.cast(turns - ops.cast(high, "float64"), "float32")

    def traced_turns(self, total_length) -> tuple:
        """`turns` with float32 arithmetic only, for a length known at run time.

        Every operand is a vector of the `d/2` pairs (a scalar repeated): TensorFlow's
        graph optimizer reorders sums and products of operands of different shapes (to
        broadcast less), which would undo the error-free steps.
        """
        pairs = self.pairs

        def constant(value):
            return ops.convert_to_tensor(np.broadcast_to(np.float32(value), (pairs,)).copy())

        m = float(self.max_position_embeddings)
        length = ops.broadcast_to(ops.cast(total_length, "float32"), (pairs,))
        length = ops.maximum(length, constant(m))  # exact below 2^24
        growth = constant(self._factor[0]) * length / constant(m) - constant(self.factor - 1.0)
        c0 = ops.exp(ops.log(growth) * constant(-1.0 / self.exponent))
        powers = self._powers(c0)  # c0^k for pair k, two words
        # The Newton residual r = 1 - c0^n · g = (M - c0^n · (factor·L - (factor-1)·M)) / M.
        scaled_high, scaled_error = _two_product(constant(self._factor[0]), length)
        scaled_low = scaled_error + constant(self._factor[1]) * length
        total, error = _two_sum(scaled_high, constant(-self._offset[0]))
        numerator = _quick_sum(total, error + (scaled_low - constant(self._offset[1])))
        last = tuple(ops.broadcast_to(word[-1], (pairs,)) for word in powers)  # c0^n
        high, low = _multiply(last, numerator)
        residual = ((constant(m) - high) - low) / constant(m)  # m - high: exact (Sterbenz)
        n = float(self.exponent)
        delta = residual / constant(n) + residual * residual * constant((n + 1) / (2 * n * n))
        k = ops.convert_to_tensor(np.arange(pairs, dtype=np.float32))
        # (1 + δ)^k - 1, to the δ² term (k·δ is a few 1e-5 at most).
        correction = k * delta * (constant(1.0) + (k - constant(1.0)) * delta * constant(0.5))
        high, low = _multiply(tuple(ops.convert_to_tensor(a) for a in self._turns), powers)
        return _quick_sum(high, low + high * correction)

    def _powers(self, c0) -> tuple:
        """`c0^k` for pair `k` as two words, by doubling: `c0^k` for `k < 2^(b+1)` is those
        below `2^b` and their products with `c0^(2^b)`. One two-word product per step makes
        both those and the next `c0^(2^(b+1))` (the square rides along as one more lane):
        few ops, and the same products in the same order as the bits of `k`."""
        high, low = ops.ones((1,), "float32"), ops.zeros((1,), "float32")
        power = (c0[:1], ops.zeros((1,), "float32"))  # c0^(2^b)
        while high.shape[0] < self.pairs:
            count = high.shape[0]
            words = (
                ops.concatenate([high, power[0]]),
                ops.concatenate([low, power[1]]),
            )
            factor = tuple(ops.broadcast_to(word, (count + 1,)) for word in power)
            product = _multiply(words, factor)
            high = ops.concatenate([high, product[0][:count]])
            low = ops.concatenate([low, product[1][:count]])
            power = (product[0][count:], product[1][count:])
        return high[: self.pairs], low[: self.pairs]
