"""Independent float64 numpy references, written from the formulas of SPEC §1.

Nothing here imports `keras_posenc`: every expected value in the tests comes from these
functions (or from published numbers), never from the code under test. Angles are formed
in float64 from exact integer positions, so these values are correct to ~1e-16, far below
the float32 tolerances the tests check. `multi_head_attention` returns `float32_error.Bounded`
values: the reference and the most a float32 evaluation can differ from it.
"""

from __future__ import annotations

import numpy as np
from float32_error import Bounded, table


def inverse_frequencies(width: int, max_wavelength: float = 10000.0) -> np.ndarray:
    """`ω_k = max_wavelength^(-2k/width)` for `k = 0 .. width/2 - 1`."""
    k = np.arange(width // 2, dtype=np.float64)
    return np.float64(max_wavelength) ** (-2.0 * k / width)


def angles(positions, width: int, max_wavelength: float = 10000.0) -> np.ndarray:
    """`position·ω_k`, shape `positions.shape + (width/2,)`."""
    positions = np.asarray(positions, dtype=np.float64)
    return positions[..., None] * inverse_frequencies(width, max_wavelength)


def sinusoidal(
    positions, width: int, max_wavelength: float = 10000.0, layout: str = "interleaved"
) -> np.ndarray:
    """The encoding `p_i`, shape `positions.shape + (width,)`.

    interleaved: `p[i, 2k] = sin(i·ω_k)`, `p[i, 2k+1] = cos(i·ω_k)`;
    concat: `[sin(i·ω_0), ..., sin(i·ω_{d/2-1}), cos(i·ω_0), ..., cos(i·ω_{d/2-1})]`.
    """
    theta = angles(positions, width, max_wavelength)
    encoding = np.empty(theta.shape[:-1] + (width,), dtype=np.float64)
    if layout == "interleaved":
        encoding[..., 0::2] = np.sin(theta)
        encoding[..., 1::2] = np.cos(theta)
    elif layout == "concat":
        encoding[..., : width // 2] = np.sin(theta)
        encoding[..., width // 2 :] = np.cos(theta)
    else:
        raise ValueError(layout)
    return encoding


def rotary(
    x,
    positions,
    max_wavelength: float = 10000.0,
    layout: str = "half",
    rotary_dim: int | None = None,
    sequence_axis: int = 1,
    feature_axis: int = -1,
) -> np.ndarray:
    """RoPE: every channel pair `(a, b)` at position `i` with frequency `ω_k` becomes
    `(a·cos(iω_k) - b·sin(iω_k), b·cos(iω_k) + a·sin(iω_k))`.

    Pair `k` is channels `(k, k + r/2)` for `layout="half"` and `(2k, 2k + 1)` for
    `layout="interleaved"`, `r = rotary_dim` (default: all channels); channels from `r`
    on pass through. `positions` has shape `(sequence,)` or `(batch, sequence)`.
    """
    carry_bound = isinstance(x, Bounded)
    x = x if carry_bound else np.asarray(x, dtype=np.float64)
    # Work on (batch, sequence, ..., features).
    x = np.moveaxis(x, (sequence_axis, feature_axis), (1, -1))
    features = x.shape[-1]
    rotary_dim = features if rotary_dim is None else rotary_dim
    positions = np.broadcast_to(np.asarray(positions), x.shape[:2])
    theta = angles(positions, rotary_dim, max_wavelength)  # (batch, sequence, r/2)
    theta = theta.reshape(theta.shape[:2] + (1,) * (x.ndim - 3) + theta.shape[2:])
    sin, cos = np.sin(theta), np.cos(theta)
    if carry_bound:
        sin, cos = table(sin), table(cos)

    if layout == "half":
        first = np.arange(rotary_dim // 2)
        second = first + rotary_dim // 2
    elif layout == "interleaved":
        first = np.arange(0, rotary_dim, 2)
        second = first + 1
    else:
        raise ValueError(layout)
    a, b = x[..., first], x[..., second]
    y = x.copy()
    y[..., first] = a * cos - b * sin
    y[..., second] = b * cos + a * sin
    return np.moveaxis(y, (1, -1), (sequence_axis, feature_axis))


def softmax(scores: np.ndarray, axis: int = -1) -> np.ndarray:
    """Softmax along `axis`; NaN where every score is -inf (a row the mask blocks entirely)."""
    with np.errstate(invalid="ignore"):
        shifted = scores - scores.max(axis=axis, keepdims=True)
        exponentials = np.exp(shifted)
        return exponentials / exponentials.sum(axis=axis, keepdims=True)


def multi_head_attention(
    query,
    value,
    weights: dict,
    *,
    key=None,
    rotate=None,
    attention_mask=None,
) -> tuple[np.ndarray, np.ndarray]:
    """Multi-head attention by hand, in float64.

    Args:
        query: `(batch, T, query_width)`; value and key: `(batch, S, width)`.
        weights: numpy arrays `query_kernel (query_width, heads, key_dim)`, `query_bias
            (heads, key_dim)`, likewise `key_*` and `value_*` (value_dim for value), and
            `output_kernel (heads, value_dim, out)`, `output_bias (out,)`; a missing
            bias counts as zero.
        rotate: optional `rotate(projected, "query" | "key")` applied to the projected
            queries and keys `(batch, steps, heads, key_dim)` before the dot product.
        attention_mask: optional boolean `(batch, T, S)`: False blocks attention (rows
            blocked entirely come out NaN: attention defines nothing for them).

    Returns:
        `(output (batch, T, out), scores (batch, heads, T, S))`, both `Bounded`.
    """
    key = value if key is None else key

    def project(inputs, name):
        projected = np.einsum("bti,ihd->bthd", Bounded(inputs), weights[name + "_kernel"])
        return projected + weights.get(name + "_bias", 0.0)

    q, k, v = project(query, "query"), project(key, "key"), project(value, "value")
    if rotate is not None:
        q, k = rotate(q, "query"), rotate(k, "key")
    key_dim = q.shape[-1]
    logits = np.einsum("bthd,bshd->bhts", q, k) / np.sqrt(key_dim)
    if attention_mask is not None:
        logits = np.where(np.asarray(attention_mask)[:, None], logits, -np.inf)
    scores = softmax(logits, axis=-1)
    context = np.einsum("bhts,bshd->bthd", scores, v)
    output = np.einsum("bthd,hdo->bto", context, weights["output_kernel"])
    return output + weights.get("output_bias", 0.0), scores


def linear_resize(table, new_length: int) -> np.ndarray:
    """Rows of `table` read at `j·(n - 1)/(new_length - 1)`, linearly interpolated per column."""
    table = np.asarray(table, dtype=np.float64)
    old_positions = np.arange(table.shape[0], dtype=np.float64)
    new_positions = np.linspace(0.0, table.shape[0] - 1.0, new_length)
    return np.stack([np.interp(new_positions, old_positions, column) for column in table.T], axis=1)


def half_ulp(values, mantissa_bits: int) -> np.ndarray:
    """Half the spacing of a float format with `mantissa_bits` explicit bits at `values`.

    A result rounded once (round to nearest) from the exact value lies within this of it:
    bfloat16 has 7 explicit bits, float16 10, float32 23.
    """
    magnitude = np.maximum(np.abs(np.asarray(values, dtype=np.float64)), 2.0**-14)
    return 0.5 * 2.0 ** (np.floor(np.log2(magnitude)) - mantissa_bits)


def assert_rounded_once(actual, exact, mantissa_bits: int, slack: float = 1e-6) -> None:
    """Assert `actual` is `exact` rounded once to a format with `mantissa_bits` bits.

    `slack` absorbs the float32 error of the tables (~2e-7); a second rounding in the
    low-precision format shows up as errors of up to a whole unit in the last place.
    """
    actual = np.asarray(actual, dtype=np.float64)
    error = np.abs(actual - exact)
    bound = half_ulp(exact, mantissa_bits) + slack
    wrong = error > bound
    assert not wrong.any(), (
        f"{wrong.mean():.1%} of the values are not the exact result rounded once to "
        f"{mantissa_bits} mantissa bits: max error {error.max():.3g}, worst excess over "
        f"half an ulp {(error - bound).max():.3g}"
    )
