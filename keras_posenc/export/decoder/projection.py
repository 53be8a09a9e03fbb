"""The query, key and value a layer's attention reads, as ONNX nodes (before RoPE).

Without biases or per-head norms: one MatMul of the packed `[query | key | value]` kernel
(the genai builder's packed form on CPU; GroupQueryAttention splits it). With biases
(Qwen2) the packed bias is added after it. With per-head q/k norms (Qwen3, Gemma 3) the
three are separate MatMuls, and the query and key are normed over each head's `head_dim`
(`SimplifiedLayerNormalization` on `(batch, sequence, heads, head_dim)`), as the genai
builder does for those families: GroupQueryAttention then takes them as three inputs.
A value norm (Gemma 4's, without a learned scale: a scale of ones) is written the same way.
In the standard-op graph the head norms are ONNX's `RMSNormalization`.
"""

from __future__ import annotations

import numpy as np

from keras_posenc.export.decoder.description import Attention, Norm
from keras_posenc.export.decoder.graph_builder import GraphBuilder
from keras_posenc.export.decoder.quantized_graph import weight_matmul


def _biased(g: GraphBuilder, x: str, kernel: np.ndarray, bias, name: str) -> str:
    out = weight_matmul(g, x, kernel, name)
    if bias is None:
        return out
    return g.node("Add", [out, g.initializer(f"{name}.bias", bias)])


def _head_norm(g: GraphBuilder, x: str, norm: Norm, heads: int, head_dim: int, name: str):
    by_head = g.node("Reshape", [x, g.constant([0, 0, heads, head_dim], np.int64)])
    normed = g.node(
        "RMSNormalization" if g.standard else "SimplifiedLayerNormalization",
        [by_head, g.initializer(f"{name}.weight", norm.scale)],
        axis=-1,
        epsilon=norm.epsilon,
        stash_type=1,
    )
    return g.node("Reshape", [normed, g.constant([0, 0, heads * head_dim], np.int64)])


def attention_inputs(g: GraphBuilder, i: int, hidden: str, attention: Attention) -> list[str]:
    """GroupQueryAttention's first three inputs: `[qkv, "", ""]` or `[query, key, value]`."""
    a, prefix = attention, f"layers.{i}.attn"
    if a.query_norm is None and a.key_norm is None and a.value_norm is None:
        packed = np.concatenate([a.query, a.key, a.value], axis=1)
        biases = (a.query_bias, a.key_bias, a.value_bias)
        bias = None
        if any(b is not None for b in biases):
            widths = (a.query.shape[1], a.key.shape[1], a.value.shape[1])
            bias = np.concatenate(
                [
                    np.zeros(n, np.float32) if b is None else b
                    for b, n in zip(biases, widths, strict=True)
                ]
            )
        return [_biased(g, hidden, packed, bias, f"{prefix}.qkv_proj"), "", ""]
    query = _biased(g, hidden, a.query, a.query_bias, f"{prefix}.q_proj")
    key = _biased(g, hidden, a.key, a.key_bias, f"{prefix}.k_proj")
    value = _biased(g, hidden, a.value, a.value_bias, f"{prefix}.v_proj")
    if a.query_norm is not None:
        query = _head_norm(g, query, a.query_norm, a.num_heads, a.head_dim, f"{prefix}.q_norm")
    if a.key_norm is not None:
        key = _head_norm(g, key, a.key_norm, a.kv_num_heads, a.head_dim, f"{prefix}.k_norm")
    if a.value_norm is not None:
        value = _head_norm(g, value, a.value_norm, a.kv_num_heads, a.head_dim, f"{prefix}.v_norm")
    return [query, key, value]


def query_input(g: GraphBuilder, i: int, hidden: str, attention: Attention) -> str:
    """A KV-sharing layer's query alone (its keys and values are another layer's)."""
    a, prefix = attention, f"layers.{i}.attn"
    query = _biased(g, hidden, a.query, a.query_bias, f"{prefix}.q_proj")
    if a.query_norm is not None:
        query = _head_norm(g, query, a.query_norm, a.num_heads, a.head_dim, f"{prefix}.q_norm")
    return query


def attention_output(g: GraphBuilder, i: int, heads: str, attention: Attention) -> str:
    """The output projection of the attended heads `(batch, sequence, heads * head_dim)`,
    with its bias (GPT-OSS) where it has one."""
    out = weight_matmul(g, heads, attention.output, f"layers.{i}.attn.o_proj")
    if attention.output_bias is None:
        return out
    return g.node(
        "Add", [out, g.initializer(f"layers.{i}.attn.o_proj.bias", attention.output_bias)]
    )
