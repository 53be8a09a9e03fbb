"""A decoder as plain arrays and settings: what every decoder emitter (ONNX, LiteRT) reads.

The records alone (frozen dataclasses of numpy arrays); reading them from a Keras model is
`keras_reader.py` (the package's own step models) and `keras_posenc.keras_hub` (keras_hub's
CausalLMs). RoPE tables are `(max_length, rotary_dim / 2)` float32 rows, one per position
`0..max_length-1` (onnxruntime's cos/sin caches).
"""

from __future__ import annotations

import dataclasses

import numpy as np


@dataclasses.dataclass(frozen=True)
class Norm:
    """RMSNorm: `x / sqrt(mean(x²) + epsilon) * scale`."""

    scale: np.ndarray
    epsilon: float


@dataclasses.dataclass(frozen=True)
class Rope:
    """RoPE as onnxruntime's caches: `cos`/`sin` `(max_length, rotary_dim / 2)` float32."""

    cos: np.ndarray
    sin: np.ndarray
    interleaved: bool

    @property
    def rotary_dim(self) -> int:
        return 2 * self.cos.shape[1]


@dataclasses.dataclass(frozen=True)
class Attention:
    """Grouped-query attention; kernels as `(in, out)` matrices, heads in order."""

    num_heads: int
    kv_num_heads: int
    head_dim: int
    scale: float
    query: np.ndarray  # (width, num_heads * head_dim)
    key: np.ndarray  # (width, kv_num_heads * head_dim)
    value: np.ndarray  # (width, kv_num_heads * head_dim)
    output: np.ndarray  # (num_heads * head_dim, width)
    # Optional parts (keras_hub's families; the package's own blocks: the q/k norms alone).
    query_bias: np.ndarray | None = None  # (num_heads * head_dim,), added before RoPE
    key_bias: np.ndarray | None = None  # (kv_num_heads * head_dim,)
    value_bias: np.ndarray | None = None  # (kv_num_heads * head_dim,)
    query_norm: Norm | None = None  # an RMSNorm over each head's head_dim, before RoPE
    key_norm: Norm | None = None
    value_norm: Norm | None = None  # (Gemma 4's: no learned scale, i.e. a scale of ones)
    # A query at position i attends to the keys at positions j with i - window < j <= i.
    window: int | None = None
    softcap: float = 0.0  # scores become softcap * tanh(scores / softcap) when > 0
    rope: Rope | None = (
        None  # this layer's own tables (Gemma 3's local/global); None: the decoder's
    )
    no_rope: bool = False  # a NoPE layer (SmolLM3's every fourth): q and k not rotated
    # KV sharing (Gemma 4's last `num_kv_shared_layers`): this layer computes and caches no
    # keys or values of its own (its `key`/`value` are `(width, 0)`, its k/v norms None)
    # and attends to layer `kv_source`'s cache as that layer left it in the same call.
    kv_source: int | None = None
    output_bias: np.ndarray | None = None  # (width,), added after the output kernel
    # Per-head learned logits (GPT-OSS's sinks): each head's softmax runs over its scores
    # and one more logit `sinks[h]`, whose weight is then dropped (it attends to nothing).
    sinks: np.ndarray | None = None  # (num_heads,)


@dataclasses.dataclass(frozen=True)
class Mlp:
    """`"swiglu"`: `down(silu(x @ gate) * (x @ up))`; `"gelu"`: `down(gelu_erf(x @ up))`;
    `"geglu"`: `down(gelu_tanh(x @ gate) * (x @ up))` (Gemma)."""

    kind: str
    gate: np.ndarray | None
    up: np.ndarray
    down: np.ndarray


@dataclasses.dataclass(frozen=True)
class PerLayerGate:
    """Gemma 4's per-layer input gate (E2B/E4B), after the MLP's residual and before
    `output_scale`: `x + norm((gelu_tanh(x @ gate) * per_layer_input) @ up)`."""

    gate: np.ndarray  # (width, per_layer_width)
    up: np.ndarray  # (per_layer_width, width)
    norm: Norm  # over width


@dataclasses.dataclass(frozen=True)
class PerLayerInputs:
    """Gemma 4's per-layer embeddings (PLE): block `i`'s input is
    `(norm(p[i]) + e[i]) * combine_scale`, `e = embedding[ids] * embedding_scale` and
    `p = (x @ projection) * projection_scale` (`x` the scaled token embedding), both cut
    into `num_layers` slices of `per_layer_width`; `norm` over one slice."""

    embedding: np.ndarray  # (per-layer vocabulary, num_layers * per_layer_width)
    embedding_scale: float
    projection: np.ndarray  # (width, num_layers * per_layer_width)
    projection_scale: float
    norm: Norm
    combine_scale: float

    @property
    def width(self) -> int:
        return self.norm.scale.shape[0]


@dataclasses.dataclass(frozen=True)
class Moe:
    """A mixture of experts (GPT-OSS's): `router = x @ router + router_bias`; the
    `top_k` largest router logits, softmaxed over those `top_k`, weigh their experts
    (the others weigh 0); expert `e` computes `g = clip(x @ gate[e] + gate_bias[e],
    -1e9, limit)`, `u = clip(x @ up[e] + up_bias[e], -limit, limit)` and
    `((u + 1) * g * sigmoid(alpha * g)) @ down[e] + down_bias[e]`."""

    router: np.ndarray  # (width, experts)
    router_bias: np.ndarray  # (experts,)
    top_k: int
    gate: np.ndarray  # (experts, width, intermediate)
    gate_bias: np.ndarray  # (experts, intermediate)
    up: np.ndarray  # (experts, width, intermediate)
    up_bias: np.ndarray  # (experts, intermediate)
    down: np.ndarray  # (experts, intermediate, width)
    down_bias: np.ndarray  # (experts, width)
    alpha: float
    limit: float

    kind = "moe"

    @property
    def experts(self) -> int:
        return self.router.shape[1]


@dataclasses.dataclass(frozen=True)
class Block:
    """`x + post_attention_norm(attention(attention_norm(x)))`, then the same for the MLP,
    then times `output_scale`; the post norms (Gemma 2, 3 and 4) and the scale (Gemma 4's
    `layer_scalar`) are optional."""

    attention_norm: Norm
    attention: Attention
    mlp_norm: Norm
    mlp: Mlp | Moe
    post_attention_norm: Norm | None = None
    post_mlp_norm: Norm | None = None
    output_scale: float = 1.0  # the block's output (residual included) times this (Gemma 4)
    per_layer_gate: PerLayerGate | None = None  # Gemma 4's PLE gate (see `PerLayerInputs`)


@dataclasses.dataclass(frozen=True)
class Decoder:
    """A pre-norm decoder: embedding, blocks with residuals, final norm, head."""

    embedding: np.ndarray  # (vocabulary, width)
    blocks: tuple[Block, ...]
    final_norm: Norm
    head: np.ndarray  # (width, vocabulary)
    head_bias: np.ndarray | None
    rope: Rope
    max_length: int
    embedding_scale: float = 1.0  # the embedded tokens times this (Gemma: sqrt(width))
    final_softcap: float = 0.0  # logits become cap * tanh(logits / cap) when > 0 (Gemma 2)
    per_layer_inputs: PerLayerInputs | None = None  # Gemma 4's PLE (E2B, E4B)
    # The head is the embedding's transpose, one variable (keras_hub's tie_weights): `head`
    # is then a view of `embedding`, and the ONNX file stores the table once.
    tied_head: bool = False
    # The weights Keras quantized, as stored (`keras_quantized.py`), by the names of
    # `quantized_graph.quantized_kernels` and "embed_tokens"; the arrays above are what
    # Keras computes with. None: a float model.
    stored: dict | None = None

    @property
    def vocabulary(self) -> int:
        return self.embedding.shape[0]

    @property
    def width(self) -> int:
        return self.embedding.shape[1]

    @property
    def num_layers(self) -> int:
        return len(self.blocks)

    @property
    def attention(self) -> Attention:
        """The first block's attention: the decoder's default head counts (blocks may
        differ in head_dim and kv_num_heads: Gemma 4's global layers)."""
        return self.blocks[0].attention

    def cached_layers(self) -> list[int]:
        """The layers with a cache of their own (all but the KV-sharing ones)."""
        return [i for i, b in enumerate(self.blocks) if b.attention.kv_source is None]


def optional_parts(decoder: Decoder) -> list[str]:
    """The optional parts `decoder` uses (keras_hub's families), by name; for the package's
    own decoders `[]`, or the per-head q/k norms of blocks made with `query_key_norm`. Every
    emitter (GroupQueryAttention, standard-op, LiteRT) writes them all."""
    blocks = decoder.blocks
    attentions = [block.attention for block in blocks]
    used = {
        "q/k/v biases": any(
            a.query_bias is not None or a.key_bias is not None or a.value_bias is not None
            for a in attentions
        ),
        "attention output biases": any(a.output_bias is not None for a in attentions),
        "attention sinks": any(a.sinks is not None for a in attentions),
        "per-head q/k norms": any(
            a.query_norm is not None or a.key_norm is not None for a in attentions
        ),
        "per-head v norms": any(a.value_norm is not None for a in attentions),
        "NoPE layers": any(a.no_rope for a in attentions),
        "sliding windows": any(a.window is not None for a in attentions),
        "attention soft caps": any(a.softcap for a in attentions),
        "per-layer RoPE tables": any(a.rope is not None for a in attentions),
        "post norms": any(
            b.post_attention_norm is not None or b.post_mlp_norm is not None for b in blocks
        ),
        "GeGLU MLPs": any(b.mlp.kind == "geglu" for b in blocks),
        "block output scales": any(b.output_scale != 1.0 for b in blocks),
        "per-layer head sizes": len({(a.head_dim, a.kv_num_heads) for a in attentions}) > 1,
        "shared key/value layers": any(a.kv_source is not None for a in attentions),
        "per-layer inputs": decoder.per_layer_inputs is not None,
        "mixture-of-experts MLPs": any(isinstance(b.mlp, Moe) for b in blocks),
        "an embedding scale": decoder.embedding_scale != 1.0,
        "a final logit soft cap": bool(decoder.final_softcap),
    }
    return [name for name, present in used.items() if present]


def widest_window(decoder) -> int | None:
    """The widest sliding window of `decoder` (a `Decoder`), or None: the description keeps
    only windows narrower than its `max_length`."""
    windows = [block.attention.window for block in decoder.blocks]
    return max((w for w in windows if w is not None), default=None)
