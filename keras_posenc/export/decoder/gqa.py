"""Attention as `com.microsoft.GroupQueryAttention`, as the genai model builder emits it.

Per layer: one MatMul for the packed q/k/v, one `GroupQueryAttention` (`do_rotary=1` with
the package's cos/sin tables as its caches; partial rotary through the caches' width)
that writes the new keys and values into the cache in place, one MatMul out.

GroupQueryAttention takes a row's valid tokens as the first `seqlens_k + 1` slots of its
cache (`seqlens_k = sum(attention_mask) - 1`), and in a prompt (the first call, the
sequence as long as the mask) the tokens after them as padding: a right-padded prompt.
The genai interface pads prompts on the left, so the graph turns the new tokens of each
row around (`GatherElements` by `(j + pad) mod sequence`, `pad` the row's zeros among
the new tokens, found as the first 1) before the embedding and back after the last norm.
A right-padded prompt (what onnxruntime-genai itself feeds) and a decode step have
`pad = 0` and are left as they are. A row's cache then holds its
tokens from slot 0, and a token's position is the count of 1s before it in its row of
the mask, as the interface defines. Attention sinks (GPT-OSS) are GroupQueryAttention's
`head_sink` input (onnxruntime >= 1.32 verified; `runtime_version.py`).
"""

from __future__ import annotations

import numpy as np

from keras_posenc.export.decoder.description import Attention, Decoder
from keras_posenc.export.decoder.graph import MICROSOFT, GraphBuilder
from keras_posenc.export.decoder.projection import attention_inputs, attention_output
from keras_posenc.export.errors import ExportError


def check_gqa(decoder: Decoder) -> None:
    """onnxruntime's CPU GroupQueryAttention's limits, which its kernel checks only when it
    runs (onnxruntime 1.32: "head_size shall be a multiple of 16", with or without rotary;
    "cos_cache dimension 1 must be <= head_size / 2 and a multiple of 8")."""
    attention, rope = decoder.attention, decoder.rope
    if attention.head_dim % 16:
        raise ExportError(
            f"onnxruntime's GroupQueryAttention needs head_dim to be a multiple of 16 (its CPU "
            f"kernel's limit), got {attention.head_dim}; use attention='standard' (ONNX's "
            "Attention), or formats=('litert',)."
        )
    if (rope.rotary_dim // 2) % 8:
        raise ExportError(
            f"onnxruntime's GroupQueryAttention needs rotary_dim / 2 to be a multiple of 8 (the "
            f"width of its cos/sin caches), got rotary_dim={rope.rotary_dim}; use "
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
        first = g.node("ArgMax", [g.node("Cast", [new_mask], to=6)], axis=1, keepdims=1)
        pad = first  # (B, 1)
        columns = g.node(
            "Range",
            [
                g.constant(0, i64),
                g.node("Squeeze", [length, g.constant([0], i64)]),
                g.constant(1, i64),
            ],
        )
        packed = g.node("Mod", [g.node("Add", [columns, pad]), length])
        back = g.node("Mod", [g.node("Add", [g.node("Sub", [columns, pad]), length]), length])
        self._back = g.node("Unsqueeze", [back, g.constant([2], i64)])  # (B, S, 1)
        return g.node("GatherElements", [input_ids, packed], axis=1)

    def finish(self, g: GraphBuilder, hidden: str) -> str:
        """The hidden states `(batch, sequence, width)` back in the order of the inputs."""
        index = g.node("Expand", [self._back, g.node("Shape", [hidden])])
        return g.node("GatherElements", [hidden, index], axis=1)

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
        """One layer's attention output; writes `present.{i}.key|value`."""
        # A NoPE layer: no rotation, and no cos/sin caches (empty names where `head_sink`
        # follows them; none at the end).
        tables = (
            ["", ""] if attention.no_rope else self._cos_sin(g, attention.rope or self.decoder.rope)
        )
        inputs = [
            *attention_inputs(g, i, hidden, attention),
            f"past_key_values.{i}.key",
            f"past_key_values.{i}.value",
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
            [g.name(f"layers.{i}.attn"), f"present.{i}.key", f"present.{i}.value"],
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
