"""A keras_hub CausalLM's backbone read into the export's `Decoder` (weights and settings).

Every family has `backbone.token_embedding` (a ReversibleEmbedding: the head is its
table, tied, or its `reverse_embeddings`), `transformer_layers` and `backbone.layer_norm`
(SmolLM3's `norm`). The CausalLM's class names its family (`families/`): its
`HubFamily` reads each block (and so what it adds: windows, biases, q/k norms), the
rotary layers the blocks return, its embedding scale and per-layer inputs; anything else
is refused with an error naming the class or setting.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from keras_posenc.export.decoder import keras_quantized, progress
from keras_posenc.export.decoder.description import Decoder
from keras_posenc.export.decoder.entry import checked_max_length, refuse_model_kind
from keras_posenc.export.decoder.quantized_graph import quantized_kernels
from keras_posenc.export.errors import ExportError
from keras_posenc.keras_hub import families, rotary_layers
from keras_posenc.keras_hub.backbone_settings import refuse_unread_backbone_settings
from keras_posenc.keras_hub.family import HubFamily
from keras_posenc.keras_hub.layer_readers import array, rms_norm

# Class name -> its block reader, in the order of `families.REGISTERED`.
FAMILIES = {family.causal_lm: family.read_block for family in families.REGISTERED}
# keras_hub's aliases of the classes of `FAMILIES` (the same class under another name).
ALIASES = {alias: family.causal_lm for family in families.REGISTERED for alias in family.aliases}


def is_keras_hub_causal_lm(model) -> bool:
    """Whether `model` is a keras_hub `CausalLM` (without importing keras_hub)."""
    return any(
        cls.__name__ == "CausalLM" and cls.__module__.startswith("keras_hub.")
        for cls in type(model).__mro__
    )


def family_of(causal_lm) -> HubFamily:
    """The family of keras_hub `causal_lm`.

    Raises:
        ExportError: a class of no family, naming the classes the bridge reads.
    """
    name = type(causal_lm).__name__
    family = families.family_named(name) if name in FAMILIES else None
    if not type(causal_lm).__module__.startswith("keras_hub.") or family is None:
        supported = ", ".join([*FAMILIES, *ALIASES])
        raise ExportError(
            f"save_decoder exports these keras_hub CausalLMs: {supported}; "
            f"{type(causal_lm).__module__}.{name} is not one of them."
        )
    return family


def _rope(rotaries: list, head_dims: list, max_length: int, tables: str, owner: str) -> list:
    """Each layer's tables (one `Rope` object per distinct setting and head size, shared
    by its layers)."""
    settings, tables_of, ropes = [], [], []  # settings are dicts: looked up by equality
    for rotary, head_dim in zip(rotaries, head_dims, strict=True):
        if rotary is None:  # a NoPE layer
            ropes.append(None)
            continue
        setting = (*families.rope_settings(rotary, owner), head_dim)
        if setting not in settings:
            wavelength, scaling, _ = setting
            exact = rotary_layers.exact_tables(head_dim, wavelength, scaling, max_length)
            keras_hub = families.keras_hub_rows(rotary, head_dim, max_length)
            rotary_layers.check_agreement(exact, keras_hub, max_length, owner)
            settings.append(setting)
            tables_of.append(exact if tables == "exact" else keras_hub)
        ropes.append(tables_of[settings.index(setting)])
    return ropes


def describe_causal_lm(causal_lm, max_length: int, *, tables: str = "exact") -> Decoder:
    """The `Decoder` of keras_hub `causal_lm` (one of `FAMILIES`).

    Args:
        causal_lm: a keras_hub CausalLM in float32.
        max_length: cache slots and RoPE table rows of the export (prompt included).
        tables: `"exact"` (the package's float64 tables rounded once, the default) or
            `"keras_hub"` (the float32 rows keras_hub's own layer computes: the same
            arithmetic as keras_hub, to measure what the exact tables change).

    Raises:
        ExportError: another class, a dtype other than float32, layers quantized in a
            mode the export cannot write (`keras_quantized.py`), or a setting the export
            cannot write exactly (named).
        TypeError, ValueError: `max_length` is not an integer in `[2, 2^24]`.
    """
    if tables not in ("exact", "keras_hub"):
        raise ValueError(f"tables must be 'exact' or 'keras_hub', got {tables!r}.")
    max_length = checked_max_length(max_length)
    refuse_model_kind(causal_lm)
    family = family_of(causal_lm)
    backbone = causal_lm.backbone
    owner = f"{type(causal_lm).__name__} {backbone.name!r}"
    refuse_unread_backbone_settings(backbone, owner)
    policy = backbone.dtype_policy
    if (policy.compute_dtype, policy.variable_dtype) != ("float32", "float32"):
        raise ExportError(
            f"{owner} computes in {policy.compute_dtype} (variables {policy.variable_dtype}); "
            "the export is float32 and verified against keras_hub in float32: load it with "
            'dtype="float32" (e.g. `from_preset(..., dtype="float32")`).'
        )
    with keras_quantized.collecting() as collected:
        blocks, first_rope = _blocks(family, backbone, max_length, tables, owner)
    embedding = backbone.token_embedding
    table, head, stored_embedding = _embedding(embedding, owner)
    # Gemma scales the embedded tokens by sqrt(width) in float32.
    scale = float(np.sqrt(np.float32(backbone.hidden_dim))) if family.embedding_scaled else 1.0
    softcap = _final_softcap(causal_lm, owner)
    final_norm = getattr(backbone, "layer_norm", None) or backbone.norm
    decoder = Decoder(
        embedding=table,
        blocks=blocks,
        final_norm=rms_norm(final_norm, owner, family.norms),
        head=head,
        head_bias=None,
        rope=first_rope,
        max_length=max_length,
        embedding_scale=scale,
        final_softcap=softcap,
        per_layer_inputs=(
            None if family.per_layer_inputs is None else family.per_layer_inputs(backbone, owner)
        ),
        tied_head=bool(embedding.tie_weights),
    )
    if not collected.layers and stored_embedding is None:
        return decoder
    named = quantized_kernels(decoder)
    stored = keras_quantized.stored_weights(causal_lm, named, collected, stored_embedding or {})
    return dataclasses.replace(decoder, stored=stored)


def _embedding(embedding, owner: str):
    """`(table (vocabulary, width), head (width, vocabulary), stored or None)`: the
    float32 arrays of the (Reversible)Embedding, and where Keras quantized it its stored
    forms (`{"embed_tokens", "lm_head", "layers"}`)."""
    if not getattr(embedding, "quantization_mode", None):
        table = array(embedding.embeddings)
        head = table.T if embedding.tie_weights else array(embedding.reverse_embeddings)
        return table, head, None
    table, head, float_table, float_head = keras_quantized.read_embedding(embedding, owner)
    stored = {"embed_tokens": table, "lm_head": table if head is None else head}
    if head is None:  # tied: one array, the head its transpose (as the float model's)
        float_head = float_table.T
    return float_table, float_head, {**stored, "layers": (id(embedding),)}


def _blocks(family: HubFamily, backbone, max_length: int, tables: str, owner: str):
    """`(blocks, the first RoPE table)`: each layer read by `family`, its `Rope` set
    where it is not the first table (`no_rope` where the layer has none)."""
    layers, read = backbone.transformer_layers, []
    for i, layer in enumerate(layers):
        read.append(family.read_block(layer, max_length, f"{owner} layer {i}"))
        progress.layer(i, len(layers))
    head_dims = [block.attention.head_dim for block, _ in read]
    ropes = _rope([r for _, r in read], head_dims, max_length, tables, owner)
    first_rope = next((rope for rope in ropes if rope is not None), None)
    if first_rope is None:
        raise ExportError(f"{owner}: no layer uses RoPE; the export needs one that does.")
    blocks = tuple(
        block
        if rope is first_rope
        else dataclasses.replace(
            block,
            attention=dataclasses.replace(block.attention, rope=rope, no_rope=rope is None),
        )
        for (block, _), rope in zip(read, ropes, strict=True)
    )
    _check_kv_sources(blocks, owner)
    return blocks, first_rope


def _final_softcap(causal_lm, owner: str) -> float:
    """The final cap: the embedding's, or the CausalLM's own (Gemma 4's `final_logit_cap`)."""
    embedding = causal_lm.backbone.token_embedding
    caps = [getattr(embedding, "logit_soft_cap", None), getattr(causal_lm, "final_logit_cap", None)]
    caps = [cap for cap in caps if cap]
    if len(caps) > 1:
        raise ExportError(
            f"{owner}: its logits are soft-capped twice (the embedding's logit_soft_cap "
            f"{caps[0]} and the CausalLM's final_logit_cap {caps[1]}), which the export does "
            "not write; keep one of them."
        )
    return float(caps[0]) if caps else 0.0


def _check_kv_sources(blocks, owner: str) -> None:
    """A KV-sharing layer reads an earlier layer's own cache of its head sizes."""
    for i, block in enumerate(blocks):
        a, source = block.attention, block.attention.kv_source
        if source is None:
            continue
        if not 0 <= source < i or blocks[source].attention.kv_source is not None:
            raise ExportError(
                f"{owner}: layer {i} shares the keys and values of layer {source}, which is "
                "not an earlier layer with a cache of its own (a model whose every layer "
                "shares, Gemma 4's assistant, reads an outside cache): not exported."
            )
        theirs = blocks[source].attention
        if (a.kv_num_heads, a.head_dim) != (theirs.kv_num_heads, theirs.head_dim):
            raise ExportError(
                f"{owner}: layer {i} ({a.kv_num_heads} K/V heads of {a.head_dim}) shares the "
                f"cache of layer {source} ({theirs.kv_num_heads} of {theirs.head_dim})."
            )
