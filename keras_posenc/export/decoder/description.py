"""A decoder as plain arrays and settings: what every decoder emitter (ONNX, LiteRT) reads.

`describe_decoder(model, max_length)` reads a decode-step model made the way
`keras_posenc.decoder_models` makes it (`Embedding -> DecoderBlock... -> RMSNormalization ->
Dense`) and refuses anything else with an error that names the layer. The RoPE tables are
the package's own: float64 on the host, rounded once to float32, one row per position
`0..max_length-1`, shape `(max_length, rotary_dim / 2)` (onnxruntime's cos/sin caches).
"""

from __future__ import annotations

import dataclasses

import keras
import numpy as np

from keras_posenc.backend import keras_private
from keras_posenc.export.decoder.entry import checked_max_length, refuse_model_kind
from keras_posenc.export.decoder.settings import refuse_unread_block_settings
from keras_posenc.export.decoder.weight_arrays import weight_array
from keras_posenc.export.errors import ExportError
from keras_posenc.frequencies import FrequencyTable
from keras_posenc.layers.decoder_block import DecoderBlock
from keras_posenc.rope import rope_parameters

# Layers a step model may hold besides the ones described (inputs, the named outputs).
_PASSIVE = (keras.layers.InputLayer, keras.layers.Identity)


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


def _norm(layer) -> Norm:
    if not isinstance(layer, keras.layers.RMSNormalization) or layer.axis not in (-1, [-1]):
        raise ExportError(f"Layer {layer.name!r} ({type(layer).__name__}) is not an RMSNorm.")
    return Norm(weight_array(layer.scale), float(layer.epsilon))


def rope_tables(rope_layer, head_dim: int, max_length: int) -> Rope:
    """The rows of `rope_layer` (a built `RotaryEmbedding`) for positions `0..max_length-1`.

    Raises:
        ExportError: the scaling switches frequencies by total length (`dynamic`,
            `longrope`) below `max_length`: one table then cannot serve every step.
    """
    rotary_dim = rope_layer.rotary_dim or head_dim
    parameters = rope_parameters(rotary_dim, rope_layer.max_wavelength, rope_layer.scaling)
    switch = parameters.switch_length
    if switch is not None and max_length > switch:
        rope_type = rope_layer.scaling["rope_type"]
        raise ExportError(
            f"{rope_type!r} RoPE scaling changes its frequencies once the total length passes "
            f"{switch}, and the keys already cached keep theirs: no one cos/sin table "
            f"(what GroupQueryAttention reads) gives those rotations. Export with "
            f"max_length <= {switch}, where the table is exact."
        )
    tables = rope_layer.position_tables()
    frequencies = (
        tables[0].frequencies
        if tables
        else FrequencyTable(parameters.inverse_frequencies, parameters.attention_factor)
    )
    sin, cos = frequencies.host_sin_cos(np.arange(max_length))
    return Rope(
        cos=cos.astype(np.float32),
        sin=sin.astype(np.float32),
        interleaved=rope_layer.layout == "interleaved",
    )


def _attention(layer) -> Attention:
    heads, kv_heads, head_dim = layer.num_query_heads, layer.num_key_value_heads, layer.head_dim
    if layer.use_bias or layer.use_gate or layer.sliding_window is not None:
        raise ExportError(
            f"Attention {layer.name!r}: biases, a gate and a sliding window are not exported "
            "(the window counts cache slots, padding included; GroupQueryAttention counts "
            "tokens)."
        )

    def kernel(part: str) -> np.ndarray:
        return weight_array(keras_private.attention_part(layer, part).kernel)

    query_norm, key_norm = _head_norms(layer)

    width = kernel("query_dense").shape[0]
    return Attention(
        num_heads=heads,
        kv_num_heads=kv_heads,
        head_dim=head_dim,
        scale=float(keras_private.attention_part(layer, "inverse_sqrt_head_dim")),
        query=kernel("query_dense").reshape(width, heads * head_dim),
        key=kernel("key_dense").reshape(width, kv_heads * head_dim),
        value=kernel("value_dense").reshape(width, kv_heads * head_dim),
        output=kernel("output_dense").reshape(heads * head_dim, width),
        query_norm=query_norm,
        key_norm=key_norm,
    )


# The attention's q/k norms the description holds: an RMSNorm over each head's channels
# before RoPE, with its scale as stored (Gemma's `1 + scale` rounds to the float32 that the
# layer multiplies by, as keras_hub's Gemma norms are read).
_PER_HEAD_NORMS = ("rms_per_head", "gemma_rms_per_head")


def _head_norms(layer) -> tuple[Norm | None, Norm | None]:
    kind = layer.query_key_norm
    if kind is None:
        return None, None
    if kind not in _PER_HEAD_NORMS:
        raise ExportError(
            f"Attention {layer.name!r}: query_key_norm={kind!r} is not exported; the decoder "
            f"export writes the per-head norms before RoPE ({', '.join(_PER_HEAD_NORMS)})."
        )

    def norm(sublayer) -> Norm:
        scale = weight_array(sublayer.scale)
        if kind == "gemma_rms_per_head":
            scale = np.float32(1) + scale
        return Norm(scale, float(layer.query_key_norm_epsilon))

    return norm(layer.query_norm), norm(layer.key_norm)


def _block(block: DecoderBlock) -> Block:
    mlp = Mlp(
        kind=block.mlp,
        gate=None if block.gate is None else weight_array(block.gate.kernel),
        up=weight_array(block.up.kernel),
        down=weight_array(block.down.kernel),
    )
    attention = _attention(block.attention)
    if block.attention.rotary_embedding is None:  # rope_dim=0: a NoPE layer
        attention = dataclasses.replace(attention, no_rope=True)
    return Block(_norm(block.attention_norm), attention, _norm(block.mlp_norm), mlp)


def _parts(model: keras.Model) -> tuple[list, list[DecoderBlock], list]:
    """`(embeddings, blocks, others)` of `model`'s layers, refusing unknown ones."""
    embeddings, blocks, others = [], [], []
    for layer in model.layers:
        if isinstance(layer, _PASSIVE):
            continue
        if isinstance(layer, keras.layers.Embedding):
            embeddings.append(layer)
        elif isinstance(layer, DecoderBlock):
            blocks.append(layer)
        elif isinstance(layer, (keras.layers.RMSNormalization, keras.layers.Dense)):
            others.append(layer)
        else:
            raise ExportError(
                f"save_decoder reads step models made of Embedding, DecoderBlock, "
                f"RMSNormalization and a Dense head (keras_posenc.decoder_models); layer "
                f"{layer.name!r} is a {type(layer).__name__}."
            )
    kinds = [type(layer).__name__ for layer in others]
    if len(embeddings) != 1 or not blocks or kinds != ["RMSNormalization", "Dense"]:
        raise ExportError(
            f"save_decoder expects one Embedding, DecoderBlocks, then one RMSNormalization and "
            f"one Dense head; {model.name!r} has {len(embeddings)} Embedding(s), "
            f"{len(blocks)} DecoderBlock(s) and then {kinds}."
        )
    return embeddings, blocks, others


def describe_decoder(model: keras.Model, max_length: int) -> Decoder:
    """The `Decoder` of a decode-step model (see the module docstring).

    Raises:
        ExportError: a layer that is not part of the convention, settings not exported
            (biases, gated or windowed attention, a length-switching RoPE scaling past its
            switch), blocks that differ in head counts or RoPE (NoPE blocks aside), no
            RoPE block at all, quantized layers, or a block or attention setting the
            description does not carry (`settings.py`: e.g. `attention_chunk_size`).
        TypeError, ValueError: `max_length` is not an integer in `[2, 2^24]`.
    """
    max_length = checked_max_length(max_length)
    refuse_model_kind(model)
    (embedding,), blocks, (final_norm, head) = _parts(model)
    for block in blocks:
        refuse_unread_block_settings(block)
    # NoPE blocks (rope_dim=0) are written without rotation (`Attention.no_rope`); the
    # others share one RoPE, whose tables the decoder holds.
    rotary = [block for block in blocks if block.attention.rotary_embedding is not None]
    if not rotary:
        raise ExportError(
            "Every DecoderBlock uses no RoPE (rope_dim=0): the decoder export needs at least "
            "one RoPE block for its tables."
        )
    first = rotary[0]
    for block in blocks:
        same = (block.num_query_heads, block.num_key_value_heads, block.head_dim) == (
            first.num_query_heads,
            first.num_key_value_heads,
            first.head_dim,
        )
        if not same or (
            block in rotary
            # The layers' settings, not `get_config()`: Keras's serialization imports
            # TensorFlow where installed, and this runs on every backend.
            and block.attention.rotary_embedding.scaling != first.attention.rotary_embedding.scaling
        ):
            raise ExportError(f"DecoderBlock {block.name!r} differs from {first.name!r}.")
    rope = first.attention.rotary_embedding
    for block in rotary[1:]:
        other = block.attention.rotary_embedding
        if (other.max_wavelength, other.layout, other.rotary_dim) != (
            rope.max_wavelength,
            rope.layout,
            rope.rotary_dim,
        ):
            raise ExportError(f"DecoderBlock {block.name!r} has another RoPE than {first.name!r}.")
    if head.activation is not keras.activations.linear:
        raise ExportError(f"The head {head.name!r} has an activation; logits are linear.")
    return Decoder(
        embedding=weight_array(embedding.embeddings),
        blocks=tuple(_block(block) for block in blocks),
        final_norm=_norm(final_norm),
        head=weight_array(head.kernel),
        head_bias=None if head.bias is None else weight_array(head.bias),
        rope=rope_tables(rope, first.head_dim, int(max_length)),
        max_length=int(max_length),
    )
