"""A decode-step model of DecoderBlocks read into a `Decoder` (`description.py`'s records).

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
from keras_posenc.export.decoder.description import Attention, Block, Decoder, Mlp, Norm, Rope
from keras_posenc.export.decoder.entry import checked_max_length, refuse_model_kind
from keras_posenc.export.decoder.keras_quantized import (
    collecting,
    kernel_of,
    read_embedding,
    stored_weights,
)
from keras_posenc.export.decoder.quantized_graph import quantized_kernels
from keras_posenc.export.decoder.settings import refuse_unread_block_settings
from keras_posenc.export.decoder.weight_arrays import weight_array
from keras_posenc.export.errors import ExportError
from keras_posenc.frequencies import FrequencyTable
from keras_posenc.layers.decoder_block import DecoderBlock
from keras_posenc.rope import rope_parameters

# Layers a step model may hold besides the ones described (inputs, the named outputs).
_PASSIVE = (keras.layers.InputLayer, keras.layers.Identity)


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
        return kernel_of(keras_private.attention_part(layer, part), f"Attention {layer.name!r}")

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
        gate=None if block.gate is None else kernel_of(block.gate, block.name),
        up=kernel_of(block.up, block.name),
        down=kernel_of(block.down, block.name),
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
            RoPE block at all, layers quantized in a mode the export cannot write
            (`keras_quantized.py`), or a block or attention setting the
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
    with collecting() as collected:
        decoder = Decoder(
            embedding=_table(embedding),
            blocks=tuple(_block(block) for block in blocks),
            final_norm=_norm(final_norm),
            head=kernel_of(head, f"The head {head.name!r}"),
            head_bias=None if head.bias is None else weight_array(head.bias),
            rope=rope_tables(rope, first.head_dim, int(max_length)),
            max_length=int(max_length),
        )
    if not collected.layers and not getattr(embedding, "quantization_mode", None):
        return decoder
    stored_table = {"layers": ()}
    if getattr(embedding, "quantization_mode", None):
        table = read_embedding(embedding, f"Embedding {embedding.name!r}")[0]
        stored_table = {"embed_tokens": table, "layers": (id(embedding),)}
    named = quantized_kernels(decoder)
    return dataclasses.replace(
        decoder, stored=stored_weights(model, named, collected, stored_table)
    )


def _table(embedding) -> np.ndarray:
    """The embedding's float32 table: its weights, or what a quantized one computes with."""
    if not getattr(embedding, "quantization_mode", None):
        return weight_array(embedding.embeddings)
    return read_embedding(embedding, f"Embedding {embedding.name!r}")[2]
