"""Attention with ONNX's own operators (opset 24), for runtimes without onnxruntime's contrib ops.

Per layer: one MatMul for the packed q/k/v and a `Split`, `RotaryEmbedding` (opset 23;
the package's cos/sin tables, partial rotary through `rotary_embedding_dim`) on the
queries and the new keys, one `TensorScatter` (opset 24) per cache that writes the new
keys / values at the update index (`past_sequence_length = total - sequence`, the
same for every row), one `Attention` (opset 23; grouped-query through the 4D inputs'
head counts) over the whole cache with a boolean mask, one MatMul out.

A cache slot is a column of `attention_mask` (left padding stays where it is, and its
slots are masked), so no re-pack is needed. A token's position is the count of 1s
before it in its row of the mask, as the interface defines. The mask lets query `j`
see slot `s` when `s <= past + j` and the slot is a real token, and always its own
slot: a padding token then attends to itself, keeping its keys and values finite
(an all-false row would be NaN, and NaN values times a zero weight are still NaN).
"""

from __future__ import annotations

import numpy as np

from keras_posenc.export.decoder.description import Attention, Decoder
from keras_posenc.export.decoder.graph import GraphBuilder

STANDARD_OPSET = 24


class StandardAttention:
    """Emits the graph's mask-derived inputs once, then one attention per layer."""

    def __init__(self, decoder: Decoder):
        self.decoder = decoder

    def prepare(self, g: GraphBuilder, input_ids: str, attention_mask: str) -> str:
        """Write indices, positions and the boolean attention mask; returns the ids."""
        i64, slots = np.int64, self.decoder.max_length
        batch = g.node("Shape", [input_ids], start=0, end=1)  # (1,)
        length = g.node("Shape", [input_ids], start=1, end=2)
        total = g.node("Shape", [attention_mask], start=1, end=2)
        past = g.node("Sub", [total, length])  # (1,): the first slot written
        self.write_indices = g.node("Expand", [past, batch])  # (B,)
        # Positions: the count of 1s before each new token (padding: 0).
        counts = g.node("CumSum", [attention_mask, g.constant(1, i64)])
        new_counts = g.node(
            "Slice", [counts, past, g.constant([np.iinfo(i64).max], i64), g.constant([1], i64)]
        )
        self.positions = g.node(
            "Max", [g.node("Sub", [new_counts, g.constant(1, i64)]), g.constant(0, i64)]
        )
        # (B, 1, S, slots): slot s real and s <= past + j, or s the query's own slot.
        pads = g.node(
            "Concat",
            [g.constant([0, 0, 0], i64), g.node("Sub", [g.constant([slots], i64), total])],
            axis=0,
        )
        real = g.node("Cast", [g.node("Pad", [attention_mask, pads])], to=9)  # bool (B, slots)
        real = g.node("Unsqueeze", [real, g.constant([1, 2], i64)])  # (B, 1, 1, slots)
        steps = g.node(
            "Range",
            [
                g.constant(0, i64),
                g.node("Squeeze", [length, g.constant([0], i64)]),
                g.constant(1, i64),
            ],
        )
        own = g.node("Unsqueeze", [g.node("Add", [steps, past]), g.constant([1], i64)])  # (S, 1)
        columns = g.constant(np.arange(slots)[None], i64)  # (1, slots)
        causal = g.node("LessOrEqual", [columns, own])  # (S, slots)
        visible = g.node("Or", [g.node("And", [real, causal]), g.node("Equal", [columns, own])])
        self.mask = visible
        rope = self.decoder.rope
        self.cos = g.initializer("cos_cache", rope.cos)
        self.sin = g.initializer("sin_cache", rope.sin)
        return input_ids

    def finish(self, g: GraphBuilder, hidden: str) -> str:
        return hidden

    def _heads(self, g: GraphBuilder, x: str, heads: int) -> str:
        """`(B, S, heads * dim)` -> `(B, heads, S, dim)`."""
        shape = g.constant([0, 0, heads, self.decoder.attention.head_dim], np.int64)
        return g.node("Transpose", [g.node("Reshape", [x, shape])], perm=[0, 2, 1, 3])

    def _rotate(self, g: GraphBuilder, x: str) -> str:
        rope = self.decoder.rope
        return g.node(
            "RotaryEmbedding",
            [x, self.cos, self.sin, self.positions],
            interleaved=int(rope.interleaved),
            rotary_embedding_dim=rope.rotary_dim,
        )

    def layer(self, g: GraphBuilder, i: int, hidden: str, attention: Attention) -> str:
        """One layer's attention output; writes `present.{i}.key|value`."""
        packed = np.concatenate([attention.query, attention.key, attention.value], axis=1)
        qkv = g.node("MatMul", [hidden, g.initializer(f"layers.{i}.attn.qkv_proj", packed)])
        kv_width = attention.kv_num_heads * attention.head_dim
        sizes = g.constant([attention.num_heads * attention.head_dim, kv_width, kv_width], np.int64)
        q, k, v = g.node("Split", [qkv, sizes], 3, axis=-1)
        q = self._rotate(g, self._heads(g, q, attention.num_heads))
        k = self._rotate(g, self._heads(g, k, attention.kv_num_heads))
        v = self._heads(g, v, attention.kv_num_heads)
        caches = []
        for kind, new in (("key", k), ("value", v)):
            caches.append(
                g.node(
                    "TensorScatter",
                    [f"past_key_values.{i}.{kind}", new, self.write_indices],
                    [f"present.{i}.{kind}"],
                    axis=2,
                )
            )
        output = g.node("Attention", [q, *caches, self.mask], scale=attention.scale)
        output = g.node("Transpose", [output], perm=[0, 2, 1, 3])
        output = g.node("Reshape", [output, g.constant([0, 0, -1], np.int64)])
        return g.node(
            "MatMul", [output, g.initializer(f"layers.{i}.attn.o_proj", attention.output)]
        )
