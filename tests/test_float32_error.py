"""The tests' float32 bounds: they hold for every evaluation order, and they still discriminate."""

from __future__ import annotations

import numpy as np
import pytest
import reference
from float32_error import Bounded, U, assert_within, gamma

RNG = np.random.default_rng(0)


def _float32_attention(x, weights, order):
    """Attention evaluated in float32, its sums in `order` ("forward", "reverse" or numpy's)."""

    def dot(a, b, spec):
        if order == "numpy":
            return np.einsum(spec, a, b, dtype=np.float32)
        # One product term at a time, accumulated in float32 in the chosen direction.
        inputs, output = spec.split("->")
        left, right = inputs.split(",")
        contracted = [i for i in left if i in right and i not in output]
        terms = np.einsum(f"{left},{right}->{output}{''.join(contracted)}", a, b)
        terms = terms.reshape(terms.shape[: len(output)] + (-1,)).astype(np.float32)
        steps = range(terms.shape[-1])
        total = np.zeros(terms.shape[:-1], np.float32)
        for k in reversed(steps) if order == "reverse" else steps:
            total = (total + terms[..., k]).astype(np.float32)
        return total

    f32 = np.float32
    q = dot(x, weights["query_kernel"].astype(f32), "bti,ihd->bthd")
    k = dot(x, weights["key_kernel"].astype(f32), "bti,ihd->bthd")
    v = dot(x, weights["value_kernel"].astype(f32), "bti,ihd->bthd")
    logits = dot(q * f32(1 / np.sqrt(q.shape[-1])), k, "bthd,bshd->bhts")
    exponentials = np.exp(logits - logits.max(-1, keepdims=True))
    scores = exponentials / exponentials.sum(-1, keepdims=True, dtype=f32)
    context = dot(scores.astype(f32), v, "bhts,bshd->bthd")
    return dot(context, weights["output_kernel"].astype(f32), "bthd,hdo->bto")


def _weights(width=12, heads=2, dim=8):
    weights = {
        f"{name}_kernel": RNG.normal(0, 0.4, (width, heads, dim)).astype(np.float32)
        for name in ("query", "key", "value")
    }
    weights["output_kernel"] = RNG.normal(0, 0.4, (heads, dim, width)).astype(np.float32)
    return {name: w.astype(np.float64) for name, w in weights.items()}


def test_a_dot_products_bound_is_gamma_n_times_the_absolute_products():
    x, y = RNG.normal(size=(3, 50)), RNG.normal(size=(50, 4))
    x, y = x.astype(np.float32).astype(np.float64), y.astype(np.float32).astype(np.float64)
    product = np.einsum("ij,jk->ik", Bounded(x), y)
    np.testing.assert_allclose(product.value, x @ y, rtol=1e-15)
    np.testing.assert_allclose(product.error, gamma(50) * (np.abs(x) @ np.abs(y)), rtol=1e-9)


def test_inputs_float32_cannot_hold_carry_their_rounding():
    assert Bounded(np.float32(0.1)).error == 0.0
    assert 0 < Bounded(0.1).error <= U * 0.1


def test_attention_in_float32_lies_within_the_bound_in_every_summation_order():
    weights = _weights()
    x = RNG.normal(size=(2, 9, 12)).astype(np.float32)
    expected, _ = reference.multi_head_attention(x, x, weights)
    for order in ("numpy", "forward", "reverse"):
        assert_within(_float32_attention(x, weights, order), expected)


def test_the_bound_is_far_below_the_error_of_a_wrong_position():
    weights = _weights()
    x = RNG.normal(size=(1, 9, 12)).astype(np.float32)

    def attention(positions):
        def rotate(projected, _):
            return reference.rotary(projected, positions)

        return reference.multi_head_attention(x, x, weights, rotate=rotate)[0]

    right = attention(np.arange(9))
    shifted_query = attention(np.array([0, 1, 2, 3, 5, 5, 6, 7, 8]))  # one token off by one
    with pytest.raises(AssertionError, match="outside their float32 bound"):
        assert_within(shifted_query.value, right)
    assert np.abs(shifted_query.value - right.value).max() > 10 * right.error.max()
