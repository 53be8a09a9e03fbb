"""Quantized weights in the GroupQueryAttention graph, as the genai builder writes them.

Every projection (the packed or separate q/k/v, the attention output, the MLP's gate, up
and down, the head) is one `com.microsoft.MatMulNBits` over `quantize.py`'s blocks
(symmetric: no zero points; asymmetric, `save_decoder(symmetric=False)`: each node's
`zero_points` input too). A tied embedding (the head's kernel is the table transposed)
is `GatherBlockQuantized` over the head's packed weights reshaped to `(vocabulary,
K * bits / 8)`; an untied one stays a float32 `Gather`. A mixture of experts' experts are one
`com.microsoft.QMoE` (`moe.py`; its router stays float32). Weights outside that list (Gemma
4's per-layer gate and projection) stay float32 MatMuls. The standard-op graph writes the
same weights as `DequantizeLinear` + `MatMul` (`quantized_standard.py`); a tied table is
the head's integers, and the embedding its own int8 copy of them (`tied_lookup`).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from keras_posenc.export.decoder.graph_builder import MICROSOFT, GraphBuilder
from keras_posenc.export.decoder.keras_quantized_graph import (
    concatenated,
    stored_embedding,
    stored_matmul,
)
from keras_posenc.export.decoder.moe import expert_kernels, refuse_unblockable_experts
from keras_posenc.export.decoder.quantize import quantize_as
from keras_posenc.export.decoder.quantized_embedding import quantized_lookup
from keras_posenc.export.decoder.quantized_standard import (
    dequantized_weight,
    tied_lookup,
)
from keras_posenc.export.errors import ExportError


@dataclasses.dataclass(frozen=True)
class Quantization:
    """What `save_decoder(quantize=...)` asked for: `bits`, `block_size`, and
    MatMulNBits' `accuracy_level` (0/1: float32 arithmetic on the dequantized weights;
    4: int8 activations, onnxruntime's CPU fast path, the builder's choice); `rule`
    `quantize.py`'s ("mlas" for ONNX, "litert" for LiteRT files, whose kernels always
    round activations to int8: no `accuracy_level` (None) there, and `block_size` None is
    int8 per output channel)."""

    bits: int
    block_size: int | None
    accuracy_level: int | None
    rule: str = "mlas"
    # The mode Keras quantized the model with ("int8", "int4", "int4 per channel", "gptq",
    # "awq"): its stored weights are written as they are (`block_size` then the inputs
    # rounded together: the widest of int4's / gptq's / awq's blocks, the widest row where
    # Keras rounds its rows); None: quantized at export.
    keras: str | None = None
    # False: asymmetric blocks with zero points (`quantize.py`), `save_decoder(symmetric=)`.
    symmetric: bool = True
    # The untied embedding as int4 GatherBlockQuantized too (`quantized_embedding.py`).
    embedding: bool = False

    @property
    def keras_rounded(self) -> bool:
        """Whether the file computes Keras's products of rounded rows (`KerasInt8`)."""
        return self.keras in ("int8", "int4 per channel")


def quantized_kernels(decoder) -> list[tuple[str, np.ndarray]]:
    """`[(name, kernel (K, N))]`: every weight the file writes quantized."""
    kernels = []
    for i, block in enumerate(decoder.blocks):
        a = block.attention
        for part, kernel in (("q", a.query), ("k", a.key), ("v", a.value), ("o", a.output)):
            if kernel.shape[1]:  # a KV-sharing layer's key and value are (width, 0)
                kernels.append((f"layers.{i}.attn.{part}_proj", kernel))
        if block.mlp.kind == "moe":  # QMoE's two `(experts * K, N)` kernels (`moe.py`)
            kernels.extend(expert_kernels(i, block.mlp))
            continue
        for part in ("gate", "up", "down"):
            kernel = getattr(block.mlp, part)
            if kernel is not None:
                kernels.append((f"layers.{i}.mlp.{part}_proj", kernel))
    kernels.append(("lm_head", decoder.head))
    return kernels


def refuse_unquantizable(decoder, quantization: Quantization, attention: str = "gqa") -> None:
    """Refuses, before anything is written, what MatMulNBits and QMoE cannot take: a K (a
    kernel's input width, an expert's own for QMoE) that is not a whole number of blocks;
    and with standard ops a mixture of experts (QMoE is onnxruntime's own op)."""
    if attention == "standard" and any(block.mlp.kind == "moe" for block in decoder.blocks):
        raise ExportError(
            "quantize with a mixture-of-experts MLP and attention='standard' is not yet "
            "supported (quantized experts are written as com.microsoft.QMoE); use "
            "attention='gqa', or quantize=None."
        )
    if quantization.embedding and is_tied(decoder):
        raise ExportError(
            "quantize_embedding=True, but the model's embedding is tied to its head: the "
            "table is already the head's int4 blocks (GatherBlockQuantized over them); leave "
            "quantize_embedding=False."
        )
    block = quantization.block_size
    if quantization.rule == "litert" and any(b.mlp.kind == "moe" for b in decoder.blocks):
        raise ExportError(
            "quantize with a mixture-of-experts MLP is not supported in a LiteRT file (QMoE "
            "is ONNX's); export it with quantize=None, or as ONNX."
        )
    if block is None:  # one block per output channel: any K
        return
    refuse_unblockable_experts(decoder, block)
    for name, kernel in quantized_kernels(decoder):
        if kernel.shape[0] % block:
            raise ExportError(
                f"{name}'s input width K={kernel.shape[0]} is not a multiple of "
                f"block_size={block}, which the quantized file needs; pick a block_size "
                f"(a power of 2 >= 16) that divides it."
            )


def is_tied(decoder) -> bool:
    """Whether the head's kernel is the embedding table transposed (keras_hub's
    `tie_word_embeddings`: the description says so; otherwise equal tables)."""
    if decoder.tied_head:
        return True
    return decoder.head.shape == decoder.embedding.shape[::-1] and np.array_equal(
        decoder.head, decoder.embedding.T
    )


def _stored(g: GraphBuilder, name: str, kernel: np.ndarray) -> tuple[str, ...]:
    """`(packed, scales)` initializers of `kernel` quantized, and its zero points where
    the blocks are asymmetric (MatMulNBits' and GatherBlockQuantized's inputs in order)."""
    q = g.quantization
    stored = quantize_as(kernel, q)
    packed = g.initializer(f"{name}.MatMul.weight_Q{q.bits}", stored.packed)
    names = (packed, g.initializer(f"{name}.MatMul.weight_scales", stored.scales))
    if stored.zero_points is None:
        return names
    return (*names, g.initializer(f"{name}.MatMul.weight_zp", stored.zero_points))


def _nbits(g: GraphBuilder, x: str, kernel: np.ndarray, stored: tuple[str, str], outputs=1):
    q = g.quantization
    return g.node(
        "MatMulNBits",
        [x, *stored],
        outputs,
        domain=MICROSOFT,
        K=kernel.shape[0],
        N=kernel.shape[1],
        bits=q.bits,
        block_size=q.block_size,
        accuracy_level=q.accuracy_level,
    )


def _dequantized(g: GraphBuilder, kernel: np.ndarray, name: str) -> str:
    """The standard-op graph's float kernel: `DequantizeLinear` over `kernel` quantized."""
    return dequantized_weight(g, quantize_as(kernel, g.quantization), name)


def _keras_stored(g: GraphBuilder, name: str):
    """The stored form of weight `name` where Keras quantized it, else None; the packed
    q/k/v projection is its three kernels' side by side (all three quantized, or none)."""
    stored = getattr(g, "stored", None)
    if not stored:
        return None
    if name.endswith(".qkv_proj"):
        prefix = name.removesuffix("qkv_proj")
        parts = [stored.get(f"{prefix}{part}_proj") for part in "qkv"]
        if all(part is None for part in parts):
            return None
        if any(part is None for part in parts):
            raise ExportError(f"{prefix}: q, k and v are not all quantized; not exported.")
        return concatenated(parts)
    return stored.get(name)


def _float(g: GraphBuilder) -> bool:
    """Whether the weights not stored quantized are float32 (a float graph, or a model
    Keras quantized: its float layers stay float)."""
    return getattr(g, "quantization", None) is None or getattr(g, "stored", None) is not None


def weight_matmul(g: GraphBuilder, x: str, kernel: np.ndarray, name: str, outputs=1) -> str:
    """`x @ kernel`: a float32 MatMul, or where the graph is quantized MatMulNBits (the
    standard-op graph: `DequantizeLinear` then `MatMul`; the stored form,
    `keras_quantized_graph.py`, where Keras quantized the model)."""
    keras_stored = _keras_stored(g, name)
    if keras_stored is not None:
        return stored_matmul(g, x, keras_stored, name, outputs)
    if _float(g):
        return g.node("MatMul", [x, g.initializer(name, kernel)], outputs)
    if g.standard:
        return g.node("MatMul", [x, _dequantized(g, kernel, name)], outputs)
    return _nbits(g, x, kernel, _stored(g, name, kernel), outputs)


def head_matmul(g: GraphBuilder, hidden: str, head: np.ndarray, outputs) -> str:
    """The head: a float32 MatMul, or MatMulNBits (over the weights a tied embedding's
    GatherBlockQuantized already reads, see `embedding_lookup`)."""
    keras_stored = _keras_stored(g, "lm_head")
    if keras_stored is not None:
        return stored_matmul(g, hidden, keras_stored, "lm_head", outputs)
    if _float(g):
        table = getattr(g, "tied_table", None) or g.initializer("lm_head", head)
        return g.node("MatMul", [hidden, table], outputs)
    if g.standard:
        table = getattr(g, "tied_table", None) or _dequantized(g, head, "lm_head")
        return g.node("MatMul", [hidden, table], outputs)
    stored = getattr(g, "head_stored", None) or _stored(g, "lm_head", head)
    return _nbits(g, hidden, head, stored, outputs)


def embedding_lookup(g: GraphBuilder, decoder, ids: str) -> str:
    """The embedded tokens: a float32 Gather, or where the graph is quantized and the
    table tied, `GatherBlockQuantized` over the head's packed weights (each row of the
    table is a column of the head: blocks along the width, the same nibbles); a table
    Keras quantized, from its stored form (`keras_quantized_graph.stored_embedding`)."""
    keras_stored = _keras_stored(g, "embed_tokens")
    if keras_stored is not None:
        return stored_embedding(g, keras_stored, ids)
    if _float(g):
        if not decoder.tied_head:
            return g.node("Gather", [g.initializer("embed_tokens", decoder.embedding), ids])
        # One table for both, stored once: the head's (width, vocabulary), by column.
        g.tied_table = g.initializer("lm_head", decoder.head)
        return g.node("Transpose", [g.node("Gather", [g.tied_table, ids], axis=1)], perm=[1, 2, 0])
    q = g.quantization
    if not is_tied(decoder):
        if q.embedding:
            return quantized_lookup(g, decoder.embedding, ids)
        return g.node("Gather", [g.initializer("embed_tokens", decoder.embedding), ids])
    if g.standard:  # the head's integers, and a copy for the embedding (`tied_lookup`)
        embedded, g.tied_table = tied_lookup(g, quantize_as(decoder.head, q), ids)
        return embedded
    g.head_stored = _stored(g, "lm_head", decoder.head)
    packed, scales, *zero_points = g.head_stored  # and the head's zero points, as the builder
    width = decoder.head.shape[0] * q.bits // 8
    table = g.node("Reshape", [packed, g.constant([decoder.vocabulary, width], np.int64)])
    return g.node(
        "GatherBlockQuantized",
        [table, ids, scales, *zero_points],
        domain=MICROSOFT,
        bits=q.bits,
        block_size=q.block_size,
        gather_axis=0,
        quantize_axis=1,
    )
