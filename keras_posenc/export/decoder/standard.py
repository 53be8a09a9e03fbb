"""Attention with ONNX's own operators (opset 23), for runtimes without onnxruntime's contrib ops.

Per layer: one MatMul for the packed q/k/v and a `Split`, `RotaryEmbedding` (opset 23;
the package's cos/sin tables, partial rotary through `rotary_embedding_dim`) on the
queries and the new keys, one `ScatterND` per cache that writes the new keys / values at
the update index (`past_sequence_length = total - sequence`, the same for every row;
bound to one buffer as past and present, onnxruntime writes it in place), one
`Attention` (opset 23) over the whole cache with a boolean mask, one MatMul out.

The query heads of a group share their key/value head: the attention gets them as one
key/value head's `groups * sequence` queries (the mask repeated per group), not as
`Attention`'s own grouped-query form, which onnxruntime 1.23's CPU kernel (the
package's oldest) computes wrongly (off by ~2 against numpy; 1.32 is right). Nor is
`TensorScatter` (opset 24) used: onnxruntime 1.23 stops at opset 23.

A cache slot is a column of `attention_mask` (left padding stays where it is, and its
slots are masked), so no re-pack is needed. A token's position is the count of 1s
before it in its row of the mask, as the interface defines. The mask lets query `j`
see slot `s` when `s <= past + j` and the slot is a real token, and always its own
slot: a padding token then attends to itself, keeping its keys and values finite
(an all-false row would be NaN, and NaN values times a zero weight are still NaN).

keras_hub's parts: the q/k/v biases and per-head norms as `projection.py` writes them
(then `Split` only for the packed form), soft caps as `Attention`'s `softcap`, one
cos/sin pair per distinct table (Gemma 3's local and global layers), and a sliding
window as one more mask per window: slot `s` within `window` tokens of the query, a
key's position the count of 1s of the mask up to its slot, less one. Attention sinks
(GPT-OSS) as one more key and value slot of zeros given to `Attention` (not written to
the cache), the mask then additive: 0 or `-inf` over the cache, head h's sink logit for
that slot, whose score `q·0 + sinks[h]` is then the sink's. Per-layer head sizes
(Gemma 4): one write index per K/V head count, one mask per (window, group size); a
KV-sharing layer attends to its source's written caches and writes none.
"""

from __future__ import annotations

import numpy as np

from keras_posenc.export.decoder.description import Attention, Decoder, Rope
from keras_posenc.export.decoder.genai_interface import CACHE_KINDS, past_name, present_name
from keras_posenc.export.decoder.gqa import refuse_capped_sinks
from keras_posenc.export.decoder.graph_builder import GraphBuilder
from keras_posenc.export.decoder.projection import (
    attention_inputs,
    attention_output,
    query_input,
)

STANDARD_OPSET = 23


class StandardAttention:
    """Emits the graph's mask-derived inputs once, then one attention per layer."""

    def __init__(self, decoder: Decoder):
        refuse_capped_sinks(decoder, "standard-op")
        self.decoder = decoder

    def prepare(self, g: GraphBuilder, input_ids: str, attention_mask: str) -> str:
        """Write indices, positions and the boolean attention mask; returns the ids."""
        i64 = np.int64
        # The cache's slots: the bound buffer's (onnxruntime-genai sizes it by the search's
        # max_length, which may be below the export's).
        first = self.decoder.cached_layers()[0]
        slots = g.node("Shape", [past_name(first, "key")], start=2, end=3)  # (1,)
        batch = g.node("Shape", [input_ids], start=0, end=1)  # (1,)
        length = g.node("Shape", [input_ids], start=1, end=2)
        total = g.node("Shape", [attention_mask], start=1, end=2)
        past = g.node("Sub", [total, length])  # (1,): the first slot written
        self.batch, self.length = batch, length
        self._indices = {}  # kv_heads -> ScatterND's write indices, one per head count
        self._write = lambda kv_heads: self._write_indices(g, batch, length, past, kv_heads)
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
            [g.constant([0, 0, 0], i64), g.node("Sub", [slots, total])],
            axis=0,
        )
        padded = g.node("Pad", [attention_mask, pads])  # (B, slots)
        real = g.node("Cast", [padded], to=9)  # bool
        real = g.node("Unsqueeze", [real, g.constant([1, 2], i64)])  # (B, 1, 1, slots)
        # A key's position + 1 (B, 1, 1, slots), a query's (B, 1, S, 1): for the windows.
        key_counts = g.node("CumSum", [padded, g.constant(1, i64)])
        self.key_counts = g.node("Unsqueeze", [key_counts, g.constant([1, 2], i64)])
        query_counts = g.node("Add", [self.positions, g.constant(1, i64)])
        self.query_counts = g.node("Unsqueeze", [query_counts, g.constant([1, 3], i64)])
        steps = g.node(
            "Range",
            [
                g.constant(0, i64),
                g.node("Squeeze", [length, g.constant([0], i64)]),
                g.constant(1, i64),
            ],
        )
        own = g.node("Unsqueeze", [g.node("Add", [steps, past]), g.constant([1], i64)])  # (S, 1)
        end = g.node("Squeeze", [slots, g.constant([0], i64)])
        columns = g.node(
            "Unsqueeze",
            [g.node("Range", [g.constant(0, i64), end, g.constant(1, i64)]), g.constant([0], i64)],
        )  # (1, slots)
        causal = g.node("LessOrEqual", [columns, own])  # (S, slots)
        self.visible = g.node("And", [real, causal])
        self.own = g.node("Equal", [columns, own])
        self._masks = {}  # (window (None: none), groups) -> the boolean mask of `Attention`
        self._caches = {}  # layer -> its (key, value) caches after this call's write
        self._tables = {}  # id(Rope) -> (cos, sin) initializers, one pair per distinct table
        return input_ids

    def _mask(self, g: GraphBuilder, window: int | None, groups: int) -> str:
        """`Attention`'s mask `(B, 1, groups * S, slots)` for a layer with `window`."""
        if (window, groups) not in self._masks:
            visible = self.visible
            if window is not None:  # key position > query position - window
                lowest = g.node("Sub", [self.query_counts, g.constant(window, np.int64)])
                near = g.node("Greater", [self.key_counts, lowest])
                visible = g.node("And", [visible, near])
            visible = g.node("Or", [visible, self.own])
            repeats = g.constant([1, 1, groups, 1], np.int64)
            self._masks[window, groups] = g.node("Tile", [visible, repeats])
        return self._masks[window, groups]

    def _write_indices(self, g: GraphBuilder, batch, length, past, kv_heads: int) -> str:
        """ScatterND's `(B, kv_heads, S, 3)` indices: `(row, head, past + j)`."""
        i64 = np.int64
        shape = g.node(
            "Concat", [batch, g.constant([kv_heads], i64), length, g.constant([1], i64)], axis=0
        )

        def axis(values: str, at: list[int]) -> str:
            unsqueezed = g.node("Unsqueeze", [values, g.constant(at, i64)])
            return g.node("Expand", [unsqueezed, shape])

        def count(size: str) -> str:
            end = g.node("Squeeze", [size, g.constant([0], i64)])
            return g.node("Range", [g.constant(0, i64), end, g.constant(1, i64)])

        rows = axis(count(batch), [1, 2, 3])
        heads = axis(g.constant(np.arange(kv_heads), i64), [0, 2, 3])
        slots = axis(g.node("Add", [count(length), past]), [0, 1, 3])
        return g.node("Concat", [rows, heads, slots], axis=-1)

    def finish(self, g: GraphBuilder, hidden: str) -> str:
        return hidden

    def _heads(self, g: GraphBuilder, x: str, heads: int, head_dim: int) -> str:
        """`(B, S, heads * dim)` -> `(B, heads, S, dim)`."""
        shape = g.constant([0, 0, heads, head_dim], np.int64)
        return g.node("Transpose", [g.node("Reshape", [x, shape])], perm=[0, 2, 1, 3])

    def _rotate(self, g: GraphBuilder, x: str, heads: int, rope: Rope) -> str:
        if id(rope) not in self._tables:
            self._tables[id(rope)] = (
                g.initializer("cos_cache", rope.cos),
                g.initializer("sin_cache", rope.sin),
            )
        return g.node(
            "RotaryEmbedding",
            [x, *self._tables[id(rope)], self.positions],
            interleaved=int(rope.interleaved),
            rotary_embedding_dim=rope.rotary_dim,
            num_heads=heads,  # onnxruntime 1.23 wants it with rotary_embedding_dim
        )

    def _with_sink(self, g: GraphBuilder, i: int, attention: Attention, keys, values, mask):
        """`(keys, values, mask)` with one more slot per kv head: a zero key and value,
        and in the (now additive) mask head h's sink logit, so that the zero key's score
        `0 + sinks[h]` joins the softmax and its weight multiplies a zero value."""
        i64, kv_heads = np.int64, attention.kv_num_heads
        groups, head_dim = attention.num_heads // kv_heads, attention.head_dim
        zeros_shape = g.node(
            "Concat", [self.batch, g.constant([kv_heads, 1, head_dim], i64)], axis=0
        )
        zero = g.node("ConstantOfShape", [zeros_shape])  # float32 zeros
        keys, values = (g.node("Concat", [x, zero], axis=2) for x in (keys, values))
        rows = g.node("Mul", [self.length, g.constant([groups], i64)])
        b_kv = g.node("Shape", [keys], start=0, end=2)  # (B, kv)
        slots = g.node("Shape", [mask], start=3, end=4)
        additive = g.node(
            "Where",
            [mask, g.constant(0.0, np.float32), g.constant(-np.inf, np.float32)],
        )  # (B, 1, groups * S, slots)
        additive = g.node("Expand", [additive, g.node("Concat", [b_kv, rows, slots], axis=0)])
        sinks = attention.sinks.reshape(1, kv_heads, groups, 1, 1).astype(np.float32)
        by_step = g.node(
            "Concat",
            [b_kv, g.constant([groups], i64), self.length, g.constant([1], i64)],
            axis=0,
        )
        column = g.node("Expand", [g.initializer(f"layers.{i}.attn.sinks", sinks), by_step])
        column = g.node(
            "Reshape", [column, g.node("Concat", [b_kv, rows, g.constant([1], i64)], axis=0)]
        )
        return keys, values, g.node("Concat", [additive, column], axis=-1)

    def _new_caches(self, g: GraphBuilder, i: int, hidden: str, attention: Attention):
        """`(query, key cache, value cache)`: the layer's keys and values written into
        `present.{i}.key|value`, or a KV-sharing layer's source's caches."""
        a, head_dim = attention, attention.head_dim
        rope = None if a.no_rope else (a.rope or self.decoder.rope)  # NoPE: not rotated
        if a.kv_source is not None:
            q = self._heads(g, query_input(g, i, hidden, a), a.num_heads, head_dim)
            q = q if rope is None else self._rotate(g, q, a.num_heads, rope)
            return (q, *self._caches[a.kv_source])
        q, k, v = attention_inputs(g, i, hidden, a)
        if not k:  # the packed [query | key | value]
            kv_width = a.kv_num_heads * head_dim
            widths = [a.num_heads * head_dim, kv_width, kv_width]
            q, k, v = g.node("Split", [q, g.constant(widths, np.int64)], 3, axis=-1)
        q = self._heads(g, q, a.num_heads, head_dim)
        k = self._heads(g, k, a.kv_num_heads, head_dim)
        if rope is not None:
            q = self._rotate(g, q, a.num_heads, rope)
            k = self._rotate(g, k, a.kv_num_heads, rope)
        v = self._heads(g, v, a.kv_num_heads, head_dim)
        if a.kv_num_heads not in self._indices:
            self._indices[a.kv_num_heads] = self._write(a.kv_num_heads)
        self._caches[i] = [
            g.node(
                "ScatterND",
                [past_name(i, kind), self._indices[a.kv_num_heads], new],
                [present_name(i, kind)],
            )
            for kind, new in zip(CACHE_KINDS, (k, v), strict=True)
        ]
        return (q, *self._caches[i])

    def layer(self, g: GraphBuilder, i: int, hidden: str, attention: Attention) -> str:
        """One layer's attention output; writes `present.{i}.key|value` (a KV-sharing
        layer: none; it reads its source's)."""
        q, key_cache, value_cache = self._new_caches(g, i, hidden, attention)
        # (B, heads, S, dim) -> (B, kv_heads, groups * S, dim): head h is kv head h // groups.
        head_dim, groups = attention.head_dim, attention.num_heads // attention.kv_num_heads
        grouped = g.constant([0, attention.kv_num_heads, -1, head_dim], np.int64)
        q = g.node("Reshape", [q, grouped])
        keys_values_mask = [key_cache, value_cache, self._mask(g, attention.window, groups)]
        if attention.sinks is not None:
            keys_values_mask = self._with_sink(g, i, attention, *keys_values_mask)
        output = g.node(
            "Attention",
            [q, *keys_values_mask],
            scale=attention.scale,
            softcap=attention.softcap,
        )
        heads = g.constant([0, attention.num_heads, -1, head_dim], np.int64)
        output = g.node("Reshape", [output, heads])
        output = g.node("Transpose", [output], perm=[0, 2, 1, 3])
        output = g.node("Reshape", [output, g.constant([0, 0, -1], np.int64)])
        return attention_output(g, i, output, attention)
