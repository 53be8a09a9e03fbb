"""A `Decoder` description decoded in float64 numpy: the exact logits verification falls back on.

Written from the description's definitions (`description.py`), independently of every
emitter: each row's real tokens at positions 0, 1, ... (padding dropped), the whole row
in one causal pass (teacher-forced: the tokens are given, so no cache is needed), every
part a `Decoder` may hold (biases, per-head q/k/v norms, NoPE layers, per-layer RoPE
tables, sliding windows counting tokens, soft caps, attention sinks, KV sharing, post
norms, GeGLU / GELU / SwiGLU / mixtures of experts, block output scales, Gemma 4's
per-layer inputs, the embedding scale and the final soft cap). Weights and RoPE rows are
the description's float32 values, computed on in float64.

Verification uses it where the reference is itself a float32 computation that may be
the less exact one (keras_hub forms RoPE angles in float32), and to see a mixture of
experts' router near a tie: each position's gap between its `top_k`-th and next router
logit, in the float64 router logits.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np

from keras_posenc.export.decoder.description import Attention, Block, Decoder, Moe, Norm

f64 = np.float64
# Weights of the head converted to float64 at a time (`head_blocks`): 8 MiB of float64.
HEAD_BLOCK = 2**20


def _norm(x: np.ndarray, norm: Norm) -> np.ndarray:
    variance = np.mean(x * x, axis=-1, keepdims=True)
    return x / np.sqrt(variance + norm.epsilon) * f64(norm.scale)


def _erf(x: np.ndarray) -> np.ndarray:
    try:
        from scipy.special import erf
    except ImportError:  # scipy is not a dependency: the standard library's, element by element
        return np.vectorize(math.erf, otypes=[f64])(x)
    return erf(x)


def _gelu_tanh(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 0.5 * (1 + np.tanh(0.5 * x))  # no overflow for large |x|


def _capped(x: np.ndarray, cap: float) -> np.ndarray:
    return cap * np.tanh(x / cap) if cap else x


def _rotate(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, interleaved: bool) -> np.ndarray:
    """RoPE of `x` `(n, heads, dim)` by rows `cos`/`sin` `(n, rotary_dim / 2)`."""
    half = cos.shape[1]
    rotary, rest = x[..., : 2 * half], x[..., 2 * half :]
    c, s = cos[:, None], sin[:, None]
    if interleaved:
        even, odd = rotary[..., 0::2], rotary[..., 1::2]
        rotated = np.stack([even * c - odd * s, odd * c + even * s], -1).reshape(rotary.shape)
    else:
        a, b = rotary[..., :half], rotary[..., half:]
        rotated = np.concatenate([a * c - b * s, b * c + a * s], -1)
    return np.concatenate([rotated, rest], -1)


def _heads(h, kernel, bias, norm, heads: int) -> np.ndarray:
    x = h @ f64(kernel)
    if bias is not None:
        x = x + f64(bias)
    x = x.reshape(len(h), heads, -1)
    return x if norm is None else _norm(x, norm)


def _attention(decoder: Decoder, a: Attention, h, shared):
    """`(output, (keys, values))` of one layer over a row `h` `(n, width)`; `shared` the
    source layer's `(keys, values)` for a KV-sharing layer."""
    n = len(h)
    q = _heads(h, a.query, a.query_bias, a.query_norm, a.num_heads)
    rope = None if a.no_rope else a.rope or decoder.rope
    rows = None if rope is None else (f64(rope.cos[:n]), f64(rope.sin[:n]))
    if rows is not None:
        q = _rotate(q, *rows, rope.interleaved)
    if a.kv_source is not None:
        keys, values = shared
    else:
        keys = _heads(h, a.key, a.key_bias, a.key_norm, a.kv_num_heads)
        values = _heads(h, a.value, a.value_bias, a.value_norm, a.kv_num_heads)
        if rows is not None:
            keys = _rotate(keys, *rows, rope.interleaved)
    groups = a.num_heads // a.kv_num_heads
    k, v = np.repeat(keys, groups, axis=1), np.repeat(values, groups, axis=1)
    scores = _capped(np.einsum("qhd,khd->hqk", q * a.scale, k), a.softcap)
    i, j = np.arange(n)[:, None], np.arange(n)[None, :]
    visible = j <= i
    if a.window is not None:
        visible &= i - a.window < j
    scores = np.where(visible[None], scores, -np.inf)
    top = scores.max(axis=-1, keepdims=True)
    if a.sinks is not None:
        top = np.maximum(top, f64(a.sinks)[:, None, None])
    exponentials = np.exp(scores - top)
    total = exponentials.sum(axis=-1, keepdims=True)
    if a.sinks is not None:
        total = total + np.exp(f64(a.sinks)[:, None, None] - top)
    out = np.einsum("hqk,khd->qhd", exponentials / total, v).reshape(n, -1) @ f64(a.output)
    if a.output_bias is not None:
        out = out + f64(a.output_bias)
    return out, (keys, values)


def _moe(h: np.ndarray, moe: Moe) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`(output, gap, router logits)`: `gap` `(n,)` the router's `top_k`-th logit less the
    next one (how far the choice of experts is from a tie)."""
    logits = h @ f64(moe.router) + f64(moe.router_bias)
    order = np.argsort(-logits, axis=-1, kind="stable")  # ties: the lower index, as TopK
    chosen = order[:, : moe.top_k]
    values = np.take_along_axis(logits, chosen, axis=-1)
    weights = np.exp(values - values.max(axis=-1, keepdims=True))
    weights /= weights.sum(axis=-1, keepdims=True)
    dense = np.zeros_like(logits)
    np.put_along_axis(dense, chosen, weights, axis=-1)
    out = np.zeros((len(h), moe.down.shape[-1]))
    for e in range(moe.experts):
        gate = np.clip(h @ f64(moe.gate[e]) + f64(moe.gate_bias[e]), -1e9, moe.limit)
        up = np.clip(h @ f64(moe.up[e]) + f64(moe.up_bias[e]), -moe.limit, moe.limit)
        expert = ((up + 1) * gate * _sigmoid(moe.alpha * gate)) @ f64(moe.down[e])
        out += dense[:, e : e + 1] * (expert + f64(moe.down_bias[e]))
    ranked = np.take_along_axis(logits, order, axis=-1)
    gap = ranked[:, moe.top_k - 1] - ranked[:, moe.top_k] if moe.top_k < moe.experts else None
    if gap is None:
        gap = np.full(len(h), np.inf)
    return out, gap, logits


def _mlp(h: np.ndarray, block: Block):
    mlp = block.mlp
    if isinstance(mlp, Moe):
        return _moe(h, mlp)
    up = h @ f64(mlp.up)
    if mlp.kind == "swiglu":
        gate = h @ f64(mlp.gate)
        hidden = gate * _sigmoid(gate) * up
    elif mlp.kind == "geglu":
        hidden = _gelu_tanh(h @ f64(mlp.gate)) * up
    else:
        hidden = 0.5 * up * (1 + _erf(up / math.sqrt(2)))
    return hidden @ f64(mlp.down), None, None


def _per_layer_inputs(decoder: Decoder, tokens, x) -> np.ndarray:
    ple = decoder.per_layer_inputs
    shape = (len(tokens), decoder.num_layers, ple.width)
    embedded = (f64(ple.embedding[tokens]) * ple.embedding_scale).reshape(shape)
    projected = (x @ f64(ple.projection) * ple.projection_scale).reshape(shape)
    return (_norm(projected, ple.norm) + embedded) * ple.combine_scale


def exact_hidden(decoder: Decoder, tokens) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`(hidden (n, width), router gap (n,), router scale (n,))` of one row's tokens at
    positions `0..n-1`, in float64: the final norm's output, which the head reads
    (`head_blocks`).

    The router gap is, over the mixture-of-experts layers, each position's smallest
    distance between its `top_k`-th and next router logit (`inf` without experts); the
    router scale the RMS of that layer's router logits (what a float32 error is
    relative to)."""
    tokens = np.asarray(tokens, np.int64)
    if len(tokens) > decoder.max_length:
        raise ValueError(f"{len(tokens)} tokens, past max_length={decoder.max_length}.")
    x = f64(decoder.embedding[tokens]) * decoder.embedding_scale
    per_layer = None if decoder.per_layer_inputs is None else _per_layer_inputs(decoder, tokens, x)
    gap, scale = np.full(len(tokens), np.inf), np.zeros(len(tokens))
    caches = {}
    for i, block in enumerate(decoder.blocks):
        a = block.attention
        out, caches[i] = _attention(
            decoder, a, _norm(x, block.attention_norm), caches.get(a.kv_source)
        )
        if block.post_attention_norm is not None:
            out = _norm(out, block.post_attention_norm)
        x = x + out
        out, layer_gap, router = _mlp(_norm(x, block.mlp_norm), block)
        if layer_gap is not None:
            closer = layer_gap < gap
            gap = np.where(closer, layer_gap, gap)
            scale = np.where(closer, np.sqrt(np.mean(router * router, axis=-1)), scale)
        if block.post_mlp_norm is not None:
            out = _norm(out, block.post_mlp_norm)
        x = x + out
        gate = block.per_layer_gate
        if gate is not None:
            gated = _gelu_tanh(x @ f64(gate.gate)) * per_layer[:, i]
            x = x + _norm(gated @ f64(gate.up), gate.norm)
        x = x * block.output_scale
    return _norm(x, decoder.final_norm), gap, scale


def head_blocks(decoder: Decoder, hidden: np.ndarray) -> Iterator[tuple[slice, np.ndarray]]:
    """`(columns, logits (n, len(columns)))` of the head over `hidden` (`exact_hidden`'s),
    `HEAD_BLOCK` weights a block: the float64 copy of the head is made a block at a time
    (a whole one is twice the float32 table: 2.1 GB for a vocabulary of 128256 at width
    2048), and each column's value is the same as from the whole table."""
    head = decoder.head
    columns = max(1, HEAD_BLOCK // head.shape[0])
    for start in range(0, head.shape[1], columns):
        block = slice(start, start + columns)
        logits = hidden @ f64(head[:, block])
        if decoder.head_bias is not None:
            logits = logits + f64(decoder.head_bias[block])
        yield block, _capped(logits, decoder.final_softcap)


def exact_row(decoder: Decoder, tokens) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`(logits (n, vocabulary), router gap (n,), router scale (n,))` of one row's tokens
    at positions `0..n-1`, in float64 (`exact_hidden`, then the head: `head_blocks`)."""
    hidden, gap, scale = exact_hidden(decoder, tokens)
    logits = np.empty((len(hidden), decoder.vocabulary))
    for columns, block in head_blocks(decoder, hidden):
        logits[:, columns] = block
    return logits, gap, scale


def exact_greedy(decoder: Decoder, prompts: np.ndarray, mask: np.ndarray, tokens: np.ndarray):
    """The float64 logits along a given greedy path, in `greedy_generation.keras_greedy`'s layout.

    Args:
        decoder: the description.
        prompts: `(batch, prompt)` int, padded on the left where `mask` is 0.
        mask: `(batch, prompt)`.
        tokens: `(batch, steps + 1)`: the path (the reference's tokens); step `s`'s
            logits follow token `s - 1`.

    Returns:
        `(logits, router)`: `logits` as the greedy runners return them (`logits[0]`
        `(batch, prompt, vocabulary)`, `logits[s]` `(batch, vocabulary)`), 0 at padding;
        `router` `(gap, scale)` in the same layout without the vocabulary axis.
    """
    batch, width = prompts.shape
    steps = tokens.shape[1] - 1
    vocabulary = decoder.vocabulary
    prompt = np.zeros((batch, width, vocabulary))
    step = np.zeros((steps, batch, vocabulary))
    gaps = [np.full((batch, width), np.inf), np.full((steps, batch), np.inf)]
    scales = [np.zeros((batch, width)), np.zeros((steps, batch))]
    for row in range(batch):
        real = mask[row].astype(bool)
        n = int(real.sum())
        path = np.concatenate([prompts[row, real], tokens[row, :steps]])
        hidden, gap, scale = exact_hidden(decoder, path)
        gaps[0][row, real], scales[0][row, real] = gap[:n], scale[:n]
        gaps[1][:, row], scales[1][:, row] = gap[n:], scale[n:]
        # Into the layout a block at a time: no whole (n, vocabulary) row besides it.
        for columns, block in head_blocks(decoder, hidden):
            prompt[row, real, columns], step[:, row, columns] = block[:n], block[n:]
    as_steps = lambda pair: [pair[0], *pair[1]]  # noqa: E731
    return as_steps((prompt, step)), (as_steps(gaps), as_steps(scales))
