"""A float32 bound for a whole attention layer, beside transformers' own (float32_error.py's rules).

Used with `attention_parity.exact_attention`, which gives it the exact (float64) attention's
probabilities and q/k norms' gains.
"""

from __future__ import annotations

import numpy as np
from float32_error import EXP_ULPS, RSQRT_ULPS, TABLE_ERROR, U, _gamma, linear_error


def attention_error(
    x,
    kernels: dict,
    *,
    heads: int,
    kv_heads: int,
    head_dim: int,
    scale: float,
    weights,
    norms: dict | None = None,
    gate: bool = False,
    table_error: float = TABLE_ERROR,
    query_factor=None,
    unit: float = U,
    causal: bool = True,
) -> np.ndarray:
    """The most a float32 evaluation of (causal) rotary attention can be off, per output.

    The computation: `q, k, v = x W + b` (queries with a sigmoid gate beside them when
    `gate`), RoPE on `q, k` and optionally a norm of each (before or after RoPE), scores
    `scale q·k`, a causal softmax, `Σ P v` per head (times the gate), then `W_o` and its
    bias. The forward error bounds of the module docstring are carried per head as
    2-norms (Cauchy-Schwarz for `q·k`; a rotation keeps a vector's 2-norm and moves an
    error's 2-norm by at most `2(τ + 3u)` of it, `τ` the table error); the softmax of scores
    each off by at most `Δ` has every probability within `P (e^{2Δ}(1+Eu)(1+2u) /
    ((1-Eu)(1-γ_S)) - 1)`, `E = EXP_ULPS`. A norm `b = w a / rms(a)` over a group (one head,
    or all heads) with gains `G = max |b_i / a_i|` moves an error `ε = ||δa|| / ||a||`
    of its group to `(G ||δa_h|| + ||b_h|| ε) / (1 - ε)` per head, plus its own rounding
    `(γ_{n+1} / 2 + (RSQRT_ULPS + 3) u) ||b_h||`.

    Args:
        x: float64 input `(batch, T, width)`.
        kernels: float64 `(in, out)` kernels `query`, `key`, `value`, `output` and their
            biases `query_bias`, ... (missing: none). With `gate`, the query kernel's
            outputs are per head the `head_dim` queries, then the `head_dim` gate inputs.
        heads, kv_heads, head_dim: the attention's sizes.
        scale: the scores' factor.
        weights: float64 attention probabilities `(batch, heads, T, S)`.
        norms: optional `{"query": (a, b), "key": (a, b)}`: a norm's float64 input and output,
            `(batch, T, groups, group)` (a group: one head or all heads).
        gate: whether a sigmoid gate multiplies each head's output.
        table_error: how far a cos / sin table entry can be from the exact one.
        query_factor: optional float64 `(T,)` factors of the queries (an attention
            temperature), applied after RoPE and norms, each rounded once.
        unit: the unit roundoff (`U`; `2.0**-53` bounds a float64 evaluation).
        causal: whether each query sees only its own and earlier keys (else every key).

    Returns:
        float64 `(batch, T, out)`: bound on `|float32 output - exact output|`.
    """
    norms = norms or {}
    batch, length, _ = x.shape
    rope = 2 * (table_error + 3 * unit)

    def projected(name, count, rows):
        bias = kernels.get(name + "_bias")
        value = x @ kernels[name] + (0.0 if bias is None else bias)
        error = linear_error(x, kernels[name], bias, unit)
        shape = (batch, length, count, rows)
        return value.reshape(shape), error.reshape(shape)

    query, query_error = projected("query", heads, head_dim * (2 if gate else 1))
    gate_value, gate_error = query[..., head_dim:], query_error[..., head_dim:]
    query, query_error = query[..., :head_dim], query_error[..., :head_dim]
    key, key_error = projected("key", kv_heads, head_dim)
    value, value_error = projected("value", kv_heads, head_dim)

    def rotated(role, vector, error):
        """(2-norm, error 2-norm) per head of the rotated, normalized queries or keys."""
        size = np.linalg.norm(vector, axis=-1)
        error = np.linalg.norm(error, axis=-1) + rope * size
        if role not in norms:
            return size, error
        a, b = (np.asarray(t, np.float64) for t in norms[role])
        count, group = vector.shape[2], a.shape[-1]
        a, b = a.reshape(batch, length, -1, group), b.reshape(batch, length, -1, group)
        with np.errstate(divide="ignore", invalid="ignore"):
            gain = np.where(a != 0, np.abs(b / a), 0.0).max(-1)  # (batch, T, groups)
        heads_per_group = count // a.shape[2]
        group_error = np.sqrt((error**2).reshape(batch, length, -1, heads_per_group).sum(-1))
        relative = group_error / np.linalg.norm(a, axis=-1)
        assert (relative < 0.5).all(), "the norm's input is too small for a bound"
        spread = lambda t: np.repeat(t, heads_per_group, axis=2)  # noqa: E731
        out_size = np.linalg.norm(b.reshape(batch, length, count, head_dim), axis=-1)
        rounding = _gamma(group + 1, unit) / 2 + (RSQRT_ULPS + 3) * unit
        error = (spread(gain) * error + out_size * spread(relative)) / (1 - spread(relative))
        return out_size, error + (rounding + rope) * out_size

    q_size, q_error = rotated("query", query, query_error)  # (batch, T, heads)
    if query_factor is not None:
        factor = np.abs(np.asarray(query_factor, np.float64))[None, :, None]
        q_error = factor * (q_error + unit * (q_size + q_error))
        q_size = factor * q_size
    k_size, k_error = rotated("key", key, key_error)
    group = heads // kv_heads
    k_size, k_error = np.repeat(k_size, group, axis=2), np.repeat(k_error, group, axis=2)

    # Scores (batch, heads, T, S): the dot product's and the factors' errors, then the largest
    # over the keys each query sees (its own and earlier ones).
    q_mag, k_mag = q_size + q_error, k_size + k_error
    dot = (
        _gamma(head_dim, unit) * np.einsum("bth,bsh->bhts", q_mag, k_mag)
        + np.einsum("bth,bsh->bhts", q_error, k_size)
        + np.einsum("bth,bsh->bhts", q_size, k_error)
        + np.einsum("bth,bsh->bhts", q_error, k_error)
    )
    visible = np.ones((length, length), bool)
    visible = np.tril(visible) if causal else visible
    largest = scale * np.einsum("bth,bsh->bhts", q_mag, k_mag)
    delta = np.where(visible, scale * dot, 0.0).max(-1)
    delta = delta + 3 * unit * np.where(visible, largest, 0.0).max(-1)  # (batch, heads, T)
    seen = visible.sum(-1)
    exp_unit = EXP_ULPS * unit
    spread_p = (
        np.exp(2 * delta)
        * (1 + exp_unit)
        * (1 + 2 * unit)
        / ((1 - exp_unit) * (1 - seen * unit / (1 - seen * unit)))
        - 1
    )[..., None]  # (batch, heads, T, 1): |δP| <= spread_p · P

    # Σ_s P v per head: (batch, T, heads, head_dim).
    value_mag = np.repeat(np.abs(value) + value_error, group, axis=2)
    value_error = np.repeat(value_error, group, axis=2)
    value = np.repeat(value, group, axis=2)
    weights = np.asarray(weights, np.float64)
    mixed = np.einsum("bhts,bshd->bhtd", weights, value_mag)
    context_error = (
        spread_p * mixed
        + np.einsum("bhts,bshd->bhtd", weights, value_error)
        + _gamma(length, unit) * (1 + spread_p) * mixed
    )
    context_error = np.moveaxis(context_error, 1, 2)
    context = np.moveaxis(np.einsum("bhts,bshd->bhtd", weights, np.abs(value)), 1, 2)
    if gate:
        sigmoid = 1 / (1 + np.exp(-gate_value))
        sigmoid_error = gate_error / 4 + (EXP_ULPS + 3) * unit
        context_error = (
            context_error * (sigmoid + sigmoid_error)
            + context * sigmoid_error
            + unit * (context + context_error) * (sigmoid + sigmoid_error)
        )
        context = context * sigmoid
    context_error = context_error.reshape(batch, length, heads * head_dim)
    context = context.reshape(batch, length, heads * head_dim)
    output = np.abs(kernels["output"])
    bias = kernels.get("output_bias")
    return context_error @ output + _gamma(heads * head_dim + 1, unit) * (
        (context + context_error) @ output + (0.0 if bias is None else np.abs(bias))
    )


def keras_attention_error(layer, x, causal: bool, **call) -> np.ndarray:
    """`attention_error` of a Keras `MultiHeadAttention` (or a rotary subclass) on `x`
    (self-attention, equal head counts), with the probabilities of its float64 twin.

    `call`: further arguments of the layer's call (positions, starts), given to the twin.
    """
    x = np.asarray(x, np.float64)
    twin = type(layer).from_config({**layer.get_config(), "dtype": "float64"})
    twin(x, x, **call)
    twin.set_weights([np.asarray(w, np.float64) for w in layer.get_weights()])
    _, weights = twin(x, x, use_causal_mask=causal, return_attention_scores=True, **call)
    width, kernels = x.shape[-1], {}
    for variable in layer.weights:
        role, kind = variable.path.split("/")[-2:]
        role = {"attention_output": "output"}.get(role, role)
        value = np.asarray(variable, np.float64)
        if kind == "bias":
            kernels[f"{role}_bias"] = value.ravel()
        else:
            shape = (-1, width) if role == "output" else (width, -1)
            kernels[role] = value.reshape(shape)
    heads, head_dim = layer.get_config()["num_heads"], layer.get_config()["key_dim"]
    return attention_error(
        x,
        kernels,
        heads=heads,
        kv_heads=heads,
        head_dim=head_dim,
        scale=head_dim**-0.5,
        weights=np.asarray(weights, np.float64),
        causal=causal,
    )
