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


def _grouped_attention(x, kernels, heads, kv_heads, dtype, epsilon=1e-6):
    """Causal grouped attention with per-head RMS q/k norms, every step in `dtype`."""
    x = x.astype(dtype)
    batch, length, _ = x.shape

    def project(name, count):
        out = x @ kernels[name].astype(dtype) + kernels[name + "_bias"].astype(dtype)
        return out.reshape(batch, length, count, -1)

    def norm(t):
        return t / np.sqrt(np.mean(t * t, -1, keepdims=True) + dtype(epsilon))

    a_q, a_k = project("query", heads), project("key", kv_heads)
    q, k, v = norm(a_q), norm(a_k), project("value", kv_heads)
    k, v = (np.repeat(t, heads // kv_heads, axis=2) for t in (k, v))
    scores = np.einsum("bthd,bshd->bhts", q, k) * dtype(q.shape[-1] ** -0.5)
    scores = np.where(np.tri(length, dtype=bool), scores, dtype(-np.inf))
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    weights = weights / weights.sum(-1, keepdims=True)
    context = np.einsum("bhts,bshd->bthd", weights, v).reshape(batch, length, -1)
    output = context @ kernels["output"].astype(dtype) + kernels["output_bias"].astype(dtype)
    return output, weights, {"query": (a_q, q), "key": (a_k, k[:, :, :: heads // kv_heads])}


def test_the_attention_bound_holds_for_a_float32_evaluation():
    from attention_error import attention_error

    heads, kv_heads, head_dim, width = 4, 2, 16, 64
    x = RNG.normal(size=(2, 8, width)).astype(np.float32)
    kernels = {}
    for name, outputs in (("query", heads), ("key", kv_heads), ("value", kv_heads)):
        kernels[name] = RNG.normal(size=(width, outputs * head_dim)).astype(np.float32) * 0.3
        kernels[name + "_bias"] = RNG.normal(size=outputs * head_dim).astype(np.float32)
    kernels["output"] = RNG.normal(size=(heads * head_dim, width)).astype(np.float32) * 0.3
    kernels["output_bias"] = RNG.normal(size=width).astype(np.float32)
    exact, weights, norms = _grouped_attention(x, kernels, heads, kv_heads, np.float64)
    kernels = {name: value.astype(np.float64) for name, value in kernels.items()}
    bound = attention_error(
        x.astype(np.float64),
        kernels,
        heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        scale=head_dim**-0.5,
        weights=weights,
        norms=norms,
    )
    actual, _, _ = _grouped_attention(x, kernels, heads, kv_heads, np.float32)
    assert actual.dtype == np.float32
    error = np.abs(actual - exact)
    assert (error <= bound).all()
    # It still tells: outputs 1% off are outside it.
    wrong = exact * (1 + 1e-2)
    assert (np.abs(wrong - exact) > bound).any()
