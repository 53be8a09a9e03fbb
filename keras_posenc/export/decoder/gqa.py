"""Attention as `com.microsoft.GroupQueryAttention`, as the genai model builder emits it.

Per layer: one MatMul for the packed q/k/v, one `GroupQueryAttention` (`do_rotary=1` with
the package's cos/sin tables as its caches; partial rotary through the caches' width)
that writes the new keys and values into the cache in place, one MatMul out.

GroupQueryAttention takes a row's valid tokens as the first `seqlens_k + 1` slots of its
cache (`seqlens_k = sum(attention_mask) - 1`), and in a prompt (the first call, the
sequence as long as the mask) the tokens after them as padding: a right-padded prompt.
The genai interface pads prompts on the left, so the graph turns the new tokens of each
row around (`GatherElements` by `(j + pad) mod sequence`, `pad` the row's zeros among
the new tokens, found as the first 1) before the embedding and back after the last norm
(`GatherND` by `(j - pad) mod sequence`).
A right-padded prompt (what onnxruntime-genai itself feeds) and a decode step have
`pad = 0` and are left as they are. A row's cache then holds its
tokens from slot 0, and a token's position is the count of 1s before it in its row of
the mask, as the interface defines. Attention sinks (GPT-OSS) are GroupQueryAttention's
`head_sink` input (onnxruntime >= 1.32 verified; `runtime_version.py`).

Per-layer head sizes and K/V head counts (Gemma 4's global layers): each node its own
`kv_num_heads` and cos/sin caches (node inputs, any width the kernel allows). A KV-sharing
layer: see `GqaAttention._shared`.
"""

from __future__ import annotations

import numpy as np

from keras_posenc.export.decoder.description import Attention, Decoder
from keras_posenc.export.decoder.genai_interface import past_names, present_names
from keras_posenc.export.decoder.graph_builder import MICROSOFT, GraphBuilder
from keras_posenc.export.decoder.projection import (
    attention_inputs,
    attention_output,
    query_input,
)
from keras_posenc.export.errors import ExportError


def check_gqa(decoder: Decoder) -> None:
    """onnxruntime's CPU GroupQueryAttention's limits, which its kernel checks only when it
    runs (onnxruntime 1.32: "head_size shall be a multiple of 16", with or without rotary;
    "cos_cache dimension 1 must be <= head_size / 2 and a multiple of 8"), per layer (each
    has its own head size and tables: Gemma 4's global layers)."""
    for i, block in enumerate(decoder.blocks):
        attention = block.attention
        rope = attention.rope or decoder.rope
        if attention.head_dim % 16:
            raise ExportError(
                f"onnxruntime's GroupQueryAttention needs head_dim to be a multiple of 16 (its "
                f"CPU kernel's limit), got {attention.head_dim} (layer {i}); use "
                "attention='standard' (ONNX's Attention), or formats=('litert',)."
            )
        if not attention.no_rope and (
            (rope.rotary_dim // 2) % 8 or rope.rotary_dim > attention.head_dim
        ):
            raise ExportError(
                f"onnxruntime's GroupQueryAttention needs rotary_dim / 2 to be a multiple of 8 "
                f"(the width of its cos/sin caches) and rotary_dim <= head_dim, got "
                f"rotary_dim={rope.rotary_dim}, head_dim={attention.head_dim} (layer {i}); use "
                "attention='standard' (ONNX's Attention), or formats=('litert',)."
            )


def refuse_capped_sinks(decoder: Decoder, graph: str) -> None:
    """Sinks with soft-capped scores: whether the runtime caps the sink logit too is not
    verified (GPT-OSS has no caps), so the pair is refused rather than guessed."""
    for i, block in enumerate(decoder.blocks):
        attention = block.attention
        if attention.sinks is not None and attention.softcap:
            raise ExportError(
                f"Layer {i} has attention sinks and soft-capped scores together, which the "
                f"{graph} graph does not write (whether the sink logit is capped too is not "
                "verified); write the LiteRT file alone (formats=('litert',)), which caps "
                "the scores and not the sinks."
            )


class GqaAttention:
    """Emits the graph's mask-derived inputs once, then one attention per layer."""

    def __init__(self, decoder: Decoder):
        check_gqa(decoder)
        refuse_capped_sinks(decoder, "GroupQueryAttention")
        self.decoder = decoder

    def prepare(self, g: GraphBuilder, input_ids: str, attention_mask: str) -> str:
        """`seqlens_k`, `total_sequence_length`, the caches; returns the re-packed ids."""
        i64 = np.int64
        total = g.node("ReduceSum", [attention_mask, g.constant([1], i64)], keepdims=0)
        seqlens = g.node("Sub", [total, g.constant(1, i64)])
        self.seqlens_k = g.node("Cast", [seqlens], to=6)  # int32
        width = g.node("Shape", [attention_mask], start=1, end=2)
        total_length = g.node("Squeeze", [width, g.constant([0], i64)])
        self.total_length = g.node("Cast", [total_length], to=6)
        self._tables = {}  # id(Rope) -> (cos, sin) initializers, one pair per distinct table
        self._new_kv = {}  # layer -> its GroupQueryAttention key and value inputs
        # The new tokens turned around so that each row's padding comes last.
        length = g.node("Shape", [input_ids], start=1, end=2)  # (1,)
        new_mask = g.node(
            "Slice",
            [
                attention_mask,
                g.node("Neg", [length]),
                g.constant([np.iinfo(i64).max], i64),
                g.constant([1], i64),
            ],
        )
        # The first real token of each row (0 for a right-padded or unpadded row).
        pad = g.node("ArgMax", [g.node("Cast", [new_mask], to=6)], axis=1, keepdims=1)  # (B, 1)
        columns = g.node(
            "Range",
            [
                g.constant(0, i64),
                g.node("Squeeze", [length, g.constant([0], i64)]),
                g.constant(1, i64),
            ],
        )
        # ONNX's integer Mod (fmod=0) takes the divisor's sign: both indices are in [0, S).
        packed = g.node("Mod", [g.node("Add", [columns, pad]), length])
        back = g.node("Mod", [g.node("Sub", [columns, pad]), length])
        self._back = g.node("Unsqueeze", [back, g.constant([2], i64)])  # (B, S, 1)
        return g.node("GatherElements", [input_ids, packed], axis=1)

    def finish(self, g: GraphBuilder, hidden: str) -> str:
        """The hidden states `(batch, sequence, width)` back in the order of the inputs: row
        b's vector s is its vector `back[b, s]` (GatherND copies whole vectors, with no
        index expanded to the hidden states' shape). The nodes of `prepare` and this one are
        all a decode step has that the builder's graph has not (docs/quantization.md)."""
        return g.node("GatherND", [hidden, self._back], batch_dims=1)

    def _cos_sin(self, g: GraphBuilder, rope) -> tuple[str, str]:
        if id(rope) not in self._tables:
            self._tables[id(rope)] = (
                g.initializer("cos_cache", rope.cos),
                g.initializer("sin_cache", rope.sin),
            )
        return self._tables[id(rope)]

    @staticmethod
    def _sinks(g: GraphBuilder, i: int, attention: Attention) -> list[str]:
        """`head_sink` (after the unused `position_ids` and `attention_bias`), or nothing:
        GroupQueryAttention adds `exp(head_sink[h])` to head h's softmax denominator,
        which is a softmax over the scores and one more logit whose weight is dropped."""
        if attention.sinks is None:
            return []
        return ["", "", g.initializer(f"layers.{i}.attn.sinks", attention.sinks)]

    def layer(self, g: GraphBuilder, i: int, hidden: str, attention: Attention) -> str:
        """One layer's attention output; writes `present.{i}.key|value` (a KV-sharing layer:
        none, see `_shared`)."""
        # A NoPE layer: no rotation, and no cos/sin caches (empty names where `head_sink`
        # follows them; none at the end).
        tables = (
            ["", ""] if attention.no_rope else self._cos_sin(g, attention.rope or self.decoder.rope)
        )
        source = attention.kv_source
        if source is None:
            qkv = attention_inputs(g, i, hidden, attention)
            self._new_kv[i] = qkv[1:]
            caches, presents = past_names(i), present_names(i)
        else:
            qkv, caches, presents = self._shared(g, i, hidden, attention, source)
        inputs = [
            *qkv,
            *caches,
            self.seqlens_k,
            self.total_length,
            *tables,
            *self._sinks(g, i, attention),
        ]
        while inputs[-1] == "":
            inputs.pop()
        output = g.node(
            "GroupQueryAttention",
            inputs,
            [g.name(f"layers.{i}.attn"), *presents],
            domain=MICROSOFT,
            num_heads=attention.num_heads,
            kv_num_heads=attention.kv_num_heads,
            scale=attention.scale,
            do_rotary=int(not attention.no_rope),
            rotary_interleaved=int(self.decoder.rope.interleaved),
            local_window_size=-1 if attention.window is None else attention.window,
            softcap=attention.softcap,
        )[0]
        return attention_output(g, i, output, attention)

    def _shared(self, g: GraphBuilder, i: int, hidden: str, attention: Attention, source: int):
        """A KV-sharing layer's GroupQueryAttention inputs, caches and presents: its own
        query, and the source layer's new keys and values (before RoPE) over the source's
        present cache, which already holds them; GroupQueryAttention writes them again,
        the same values into the same slots, into a present of its own that is no output
        of the graph (the op has no form that reads a cache without appending to it)."""
        key, value = self._new_kv.get(source, ("", ""))
        if not key:  # the packed form: never a KV source (Gemma 4's layers norm k and v)
            raise ExportError(
                f"Layer {i} shares the keys and values of layer {source}, which has no "
                "separate key and value projections (q/k/v packed): not exported."
            )
        theirs = self.decoder.blocks[source].attention
        ours_rope, their_rope = (a.rope or self.decoder.rope for a in (attention, theirs))
        if attention.no_rope != theirs.no_rope or not (
            attention.no_rope
            or (
                np.array_equal(ours_rope.cos, their_rope.cos)
                and np.array_equal(ours_rope.sin, their_rope.sin)
            )
        ):  # the new keys are rotated again, by this layer's tables: they must be the same
            raise ExportError(
                f"Layer {i} shares the keys and values of layer {source}, whose RoPE differs: "
                "GroupQueryAttention would rotate the shared keys by this layer's tables. Use "
                "attention='standard' or formats=('litert',)."
            )
        query = query_input(g, i, hidden, attention)
        caches = present_names(source)
        presents = [g.name(f"layers.{i}.shared_key"), g.name(f"layers.{i}.shared_value")]
        return [query, key, value], caches, presents
