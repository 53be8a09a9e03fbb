"""A keras_hub CausalLM's backbone read into the export's `Decoder` (weights and settings).

Every family has `backbone.token_embedding` (a ReversibleEmbedding: the head is its
table, tied, or its `reverse_embeddings`), `transformer_layers` and `backbone.layer_norm`.
The Llama-style blocks (Llama, Llama 3, Mistral, Qwen2, Qwen3, Phi-3) share one layout
under two spellings (`_LLAMA_NAMES`, `_PHI3_NAMES`); Gemma's are read in `gemma.py`,
Gemma 4's in `gemma4.py`, SmolLM3's (NoPE layers: no rotary layer) in `smollm3.py`.
`FAMILIES` maps each class to its block reader (and so to what it adds: windows,
biases, q/k norms); anything else is refused with an error naming the class or setting.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import keras
import numpy as np

from keras_posenc.export.decoder import progress
from keras_posenc.export.decoder.description import Attention, Block, Decoder, Mlp
from keras_posenc.export.decoder.entry import checked_max_length, refuse_model_kind
from keras_posenc.export.errors import ExportError
from keras_posenc.keras_hub import rope as rope_tables
from keras_posenc.keras_hub.common import array as _array
from keras_posenc.keras_hub.common import rms_norm as _norm
from keras_posenc.keras_hub.gemma import gemma_block
from keras_posenc.keras_hub.gemma4 import gemma4_block, gemma4_per_layer_inputs
from keras_posenc.keras_hub.gpt_oss import gpt_oss_block
from keras_posenc.keras_hub.settings import refuse_unread_backbone_settings
from keras_posenc.keras_hub.smollm3 import smollm3_block

# keras_hub's aliases of the classes of `FAMILIES` (the same class under another name).
ALIASES = {"Qwen2CausalLM": "QwenCausalLM"}


def is_keras_hub_causal_lm(model) -> bool:
    """Whether `model` is a keras_hub `CausalLM` (without importing keras_hub)."""
    return any(
        cls.__name__ == "CausalLM" and cls.__module__.startswith("keras_hub.")
        for cls in type(model).__mro__
    )


def _family(causal_lm) -> str:
    name = type(causal_lm).__name__
    if not type(causal_lm).__module__.startswith("keras_hub.") or name not in FAMILIES:
        supported = ", ".join([*FAMILIES, *ALIASES])
        raise ExportError(
            f"save_decoder exports these keras_hub CausalLMs: {supported}; "
            f"{type(causal_lm).__module__}.{name} is not one of them."
        )
    return name


def _dense(layer, owner: str) -> np.ndarray:
    if layer.bias is not None or layer.activation is not keras.activations.linear:
        raise ExportError(f"{owner}: its Dense {layer.name!r} has a bias or an activation.")
    return _array(layer.kernel)


def _einsum_bias(layer) -> np.ndarray | None:
    bias = getattr(layer, "bias", None)
    return None if bias is None else _array(bias).reshape(-1)


# The attributes of a Llama-style block and attention, in keras_hub's two spellings.
_LLAMA_NAMES = dict(
    attention_norm="_self_attention_layernorm",
    attention="_self_attention_layer",
    mlp_norm="_feedforward_layernorm",
    gate="_feedforward_gate_dense",
    up="_feedforward_intermediate_dense",
    down="_feedforward_output_dense",
    query="_query_dense",
    key="_key_dense",
    value="_value_dense",
    output="_output_dense",
)
_PHI3_NAMES = dict(
    _LLAMA_NAMES,
    attention_norm="pre_attention_layernorm",
    attention="attention",
    mlp_norm="post_attention_layernorm",
    **{part: _LLAMA_NAMES[part][1:] for part in ("gate", "up", "down")},
    **{part: f"{part}_dense" for part in ("query", "key", "value", "output")},
)


def _attention(layer, names, window, max_length: int, owner: str) -> tuple[Attention, object]:
    query_dense, key_dense, value_dense, output_dense = (
        getattr(layer, names[part]) for part in ("query", "key", "value", "output")
    )
    query = _array(query_dense.kernel)  # (width, heads, head_dim)
    key = _array(key_dense.kernel)
    width, heads, head_dim = query.shape
    kv_heads = key.shape[1]
    if getattr(output_dense, "bias", None) is not None:
        raise ExportError(f"{owner}: an attention output bias is not exported.")
    norms = {}
    for part in ("query", "key"):
        norm_layer = getattr(layer, f"_{part}_dense_layer_norm", None)
        norms[part] = None if norm_layer is None else _norm(norm_layer, owner)
    attention = Attention(
        num_heads=heads,
        kv_num_heads=kv_heads,
        head_dim=head_dim,
        scale=1.0 / math.sqrt(head_dim),  # keras_hub's `_inv_norm_factor`
        query=query.reshape(width, heads * head_dim),
        key=key.reshape(width, kv_heads * head_dim),
        value=_array(value_dense.kernel).reshape(width, kv_heads * head_dim),
        output=_array(output_dense.kernel).reshape(heads * head_dim, width),
        query_bias=_einsum_bias(query_dense),
        key_bias=_einsum_bias(key_dense),
        value_bias=_einsum_bias(value_dense),
        query_norm=norms["query"],
        key_norm=norms["key"],
        # A window as wide as the cache masks nothing.
        window=None if window is None or window >= max_length else int(window),
    )
    return attention, layer.rotary_embedding_layer


def _llama_block(
    window_of, layer, max_length: int, owner: str, names=_LLAMA_NAMES
) -> tuple[Block, object]:
    """A Llama-style block; `window_of(attention layer)` its sliding window (or None)."""
    activation = getattr(layer, "activation", None)
    if activation is None or keras.activations.serialize(activation) != "silu":
        raise ExportError(f"{owner}: the feedforward activation must be silu (SwiGLU).")
    self_attention = getattr(layer, names["attention"])
    attention, rotary = _attention(
        self_attention, names, window_of(self_attention), max_length, owner
    )
    mlp = Mlp(
        kind="swiglu",
        gate=_dense(getattr(layer, names["gate"]), owner),
        up=_dense(getattr(layer, names["up"]), owner),
        down=_dense(getattr(layer, names["down"]), owner),
    )
    block = Block(
        _norm(getattr(layer, names["attention_norm"]), owner),
        attention,
        _norm(getattr(layer, names["mlp_norm"]), owner),
        mlp,
    )
    return block, rotary


def _rope(rotaries: list, head_dims: list, max_length: int, tables: str, owner: str) -> list:
    """Each layer's tables (one `Rope` object per distinct setting and head size, shared
    by its layers)."""
    settings, tables_of, ropes = [], [], []  # settings are dicts: looked up by equality
    for rotary, head_dim in zip(rotaries, head_dims, strict=True):
        if rotary is None:  # a NoPE layer
            ropes.append(None)
            continue
        setting = (*rope_tables.rope_settings(rotary, owner), head_dim)
        if setting not in settings:
            wavelength, scaling, _ = setting
            exact = rope_tables.exact_tables(head_dim, wavelength, scaling, max_length)
            keras_hub = rope_tables.keras_hub_tables(rotary, head_dim, max_length)
            rope_tables.check_agreement(exact, keras_hub, max_length, owner)
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
        ExportError: another class, a dtype other than float32, quantized layers, or a
            setting the export cannot write exactly (named).
        TypeError, ValueError: `max_length` is not an integer in `[2, 2^24]`.
    """
    if tables not in ("exact", "keras_hub"):
        raise ValueError(f"tables must be 'exact' or 'keras_hub', got {tables!r}.")
    max_length = checked_max_length(max_length)
    refuse_model_kind(causal_lm)
    read_block = FAMILIES[_family(causal_lm)]
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
    layers, read = backbone.transformer_layers, []
    for i, layer in enumerate(layers):
        read.append(read_block(layer, max_length, f"{owner} layer {i}"))
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
    embedding = backbone.token_embedding
    table = _array(embedding.embeddings)
    head = table.T if embedding.tie_weights else _array(embedding.reverse_embeddings)
    # Gemma scales the embedded tokens by sqrt(width) in float32.
    scale = float(np.sqrt(np.float32(backbone.hidden_dim))) if read_block in SCALED else 1.0
    # The final cap: the embedding's, or the CausalLM's own (Gemma 4's `final_logit_cap`).
    caps = [getattr(embedding, "logit_soft_cap", None), getattr(causal_lm, "final_logit_cap", None)]
    caps = [cap for cap in caps if cap]
    if len(caps) > 1:
        raise ExportError(
            f"{owner}: its logits are soft-capped twice (the embedding's logit_soft_cap "
            f"{caps[0]} and the CausalLM's final_logit_cap {caps[1]}), which the export does "
            "not write; keep one of them."
        )
    return Decoder(
        embedding=table,
        blocks=blocks,
        final_norm=_norm(getattr(backbone, "layer_norm", None) or backbone.norm, owner),
        head=head,
        head_bias=None,
        rope=first_rope,
        max_length=max_length,
        embedding_scale=scale,
        final_softcap=float(caps[0]) if caps else 0.0,
        per_layer_inputs=gemma4_per_layer_inputs(backbone, owner),
        tied_head=bool(embedding.tie_weights),
    )


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


def _window(attention) -> int | None:
    return attention.sliding_window_size if attention.use_sliding_window_attention else None


# Class name -> its block reader.
FAMILIES = {
    "LlamaCausalLM": functools.partial(_llama_block, lambda attention: None),
    "Llama3CausalLM": functools.partial(_llama_block, lambda attention: None),
    "MistralCausalLM": functools.partial(_llama_block, lambda attention: attention._sliding_window),
    "QwenCausalLM": functools.partial(_llama_block, _window),
    "Qwen3CausalLM": functools.partial(
        _llama_block, lambda attention: attention.sliding_window_size or None
    ),
    "Phi3CausalLM": functools.partial(_llama_block, lambda attention: None, names=_PHI3_NAMES),
    "GemmaCausalLM": gemma_block,
    "Gemma3CausalLM": gemma_block,
    "SmolLM3CausalLM": smollm3_block,
    "Gemma4CausalLM": gemma4_block,
    "GptOssCausalLM": gpt_oss_block,
}
SCALED = (gemma_block, gemma4_block)  # families whose embedded tokens are scaled by sqrt(width)
