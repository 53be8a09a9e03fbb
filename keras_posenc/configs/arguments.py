"""Reading transformers model configs: the RoPE and attention arguments of one layer.

`rotary_arguments(config)` gives the `RotaryEmbedding` keyword arguments and
`attention_arguments(config)` those of a rotary attention layer, from a transformers config
object or its dict (a raw `config.json`, transformers 4 or 5, or `to_dict()`); every form
of one config gives the same arguments. The families read are those of `FAMILIES`, with
the defaults transformers applies to a key a config leaves out. A key about RoPE that the
reader does not understand, a rope type the package does not have, or a family it does not
know is an error naming it: a config is never read by guessing.
"""

from __future__ import annotations

import re
from typing import Any

from keras_posenc._checks import short_repr
from keras_posenc.attention_temperature import attention_temperature
from keras_posenc.configs.attention import attention_settings
from keras_posenc.configs.axial import axial_arguments, is_axial
from keras_posenc.configs.families import FAMILIES
from keras_posenc.configs.family import Family
from keras_posenc.configs.language_model import (
    as_dict,
    family_of,
    head_size,
    language_config,
    positive_int,
)
from keras_posenc.configs.norms import query_key_norm_arguments
from keras_posenc.configs.rope_entries import (
    entry_arguments,
    mrope_arguments,
    rope_entries,
    whole_head_factor,
)
from keras_posenc.configs.schedules import layer_attention, layer_types, positionless_types
from keras_posenc.rope import rope_parameters

_ROPE_KEY = re.compile("rope|rotary")
_EARLY_CHECK_DIM = 2**14
# RoPE-named keys that are not RoPE parameters.
_NOT_ROPE = {"qk_nope_head_dim", "use_rope"}


def _layout(config: dict, model_type: str, family: Family, consumed: set) -> str:
    if family.rope_interleave == "ignores":
        consumed.add("rope_interleave")
        if config.get("rope_interleave", True) is not True:
            raise ValueError(
                f"{model_type}'s attention always interleaves its RoPE pairs (transformers ignores "
                f"'rope_interleave'), got rope_interleave={short_repr(config['rope_interleave'])}: "
                "remove it."
            )
    if family.rope_interleave == "reads":
        consumed.add("rope_interleave")
        interleave = config.get("rope_interleave", True)
        if not isinstance(interleave, bool):
            raise ValueError(
                f"config['rope_interleave'] must be true or false, got {short_repr(interleave)}."
            )
        return "interleaved" if interleave else "half"
    return family.layout


def _layer_types(config: dict, family: Family, entries: dict) -> list[str]:
    if None not in entries:
        return sorted(entries)
    return sorted(set(layer_types(config, family) or []))


def _chosen(
    entries: dict, types: list[str], layer_type: str | None, without: tuple[str, ...] = ()
) -> tuple[str | None, dict]:
    if layer_type is not None and layer_type in without:
        raise ValueError(
            f"Layers of type {layer_type!r} use no RoPE in this config (NoPE, linear attention "
            "or convolution); keras_posenc.rope_per_layer gives None for them."
        )
    if layer_type is not None and layer_type not in types:
        listed = ", ".join(types) if types else "none"
        raise ValueError(
            f"layer_type={short_repr(layer_type)} is not a layer type of this config (its types: "
            f"{listed})."
        )
    if None in entries:
        return layer_type, entries[None]
    if layer_type is None:
        if len(entries) > 1:
            raise ValueError(
                f"The config has RoPE parameters per layer type ({', '.join(types)}): pass "
                "layer_type= to choose one."
            )
        layer_type = types[0]
    if entries[layer_type] is None:
        raise ValueError(f"Layers of type {layer_type!r} have no RoPE in this config.")
    return layer_type, entries[layer_type]


def _unread(config: dict, consumed: set) -> None:
    unread = sorted(
        key
        for key, value in config.items()
        if _ROPE_KEY.search(key)
        and key not in consumed
        and key not in _NOT_ROPE
        and value not in (None, False)
    )
    if unread:
        raise ValueError(
            f"The config has RoPE keys this reader does not understand: {unread}; the layer "
            "would be wrong without them."
        )


def rotary_arguments(config: Any, layer_type: str | None = None, layout: str | None = None) -> dict:
    """The `RotaryEmbedding` keyword arguments a transformers config describes.

    Args:
        config: a transformers config or its dict (`config.json`, transformers 4 or 5, or
            `to_dict()`).
        layer_type: for configs with RoPE per layer type (Gemma 3 and 4, ModernBERT, OLMo 3:
            `"full_attention"` / `"sliding_attention"`), the type to read; required when the
            config has several. A type whose layers use no RoPE (EXAONE 4's global layers,
            linear attention, convolutions) is an error; `keras_posenc.rope_per_layer` gives
            each layer's.
        layout: read a `model_type` not in `FAMILIES` as a Llama-style config with this
            pairing (for a known family, the layout must be its own).

    Returns:
        `{"max_wavelength", "layout", "rotary_dim", "scaling"}`; `rotary_dim` is None when
        the whole head rotates.

    Example:

    >>> pythia = {"model_type": "gpt_neox", "hidden_size": 768, "num_attention_heads": 12,
    ...           "rotary_pct": 0.25, "rotary_emb_base": 10000}
    >>> rotary_arguments(pythia)
    {'max_wavelength': 10000.0, 'layout': 'half', 'rotary_dim': 16, 'scaling': None}
    """
    config = as_dict(config)
    if is_axial(config):
        return axial_arguments(config, layer_type, layout)
    config = language_config(config)
    model_type, family = family_of(config, layout)
    consumed = {"model_type", "qk_rope_head_dim"}
    if family.no_rope == "no_rope_layers":
        consumed.update({"no_rope_layers", "no_rope_layer_interval"})  # rope_per_layer's
    family_layout = _layout(config, model_type, family, consumed)
    if layout is not None and model_type in FAMILIES and layout != family_layout:
        raise ValueError(
            f"layout={layout!r} differs from {model_type}'s own pairing {family_layout!r}."
        )
    head_dim = head_size(config, family)
    if family.fixed:
        # GPT-J / CodeGen: base 10000 and no scaling in their code; only rotary_dim.
        consumed.update({"rotary_dim", "partial_rotary_factor"})
        _unread(config, consumed)
        # Their config's default is 64; a null makes their code build its tables for the
        # whole width, not the head: refused by positive_int.
        rotary_dim = positive_int({"rotary_dim": 64, **config}, "rotary_dim")
        theta, scaling = 10000.0, None
    else:
        entries = rope_entries(config, family, consumed, head_dim)
        _unread(config, consumed)
        types = _layer_types(config, family, entries)
        without = positionless_types(config, family)
        chosen, entry = _chosen(entries, types, layer_type, without)
        if chosen in (family.type_head_dim or {}):
            head_dim = head_size(config, family, chosen)
        theta, partial, scaling = entry_arguments(entry, config, family, None in entries, head_dim)
        if not family.reads_partial:
            partial = whole_head_factor(model_type, partial, scaling, head_dim)
        rotary_dim = int(head_dim * partial)
    if rotary_dim > head_dim or rotary_dim % 2:
        raise ValueError(
            f"The config rotates {rotary_dim} of {head_dim} channels per head; that must be an "
            "even number no larger than the head."
        )
    mrope = {} if family.fixed else mrope_arguments(entry, family, rotary_dim)
    if family.fixed and layer_type is not None:
        _chosen({None: {}}, [], layer_type)
    if rotary_dim <= _EARLY_CHECK_DIM:
        # Bad scaling values (a longrope list of the wrong length) fail here, not at build;
        # a crafted head size past any real one is left to build, which checks it first.
        rope_parameters(rotary_dim, theta, scaling)
    return {
        "max_wavelength": theta,
        "layout": family_layout,
        "rotary_dim": None if rotary_dim == head_dim else rotary_dim,
        "scaling": scaling,
        **mrope,
    }


def _chunk_and_temperature(
    config: dict, family: Family, layer_type: str | None, nope: bool, form: str
) -> dict:
    """Llama 4's chunked mask (its `chunked_attention` layers) and NoPE query temperature."""
    options = {}
    if layer_type == "chunked_attention" and family.attention_chunk_size is not None:
        chunk = {"attention_chunk_size": family.attention_chunk_size, **config}
        options["attention_chunk_size"] = positive_int(chunk, "attention_chunk_size")
    temperature = attention_temperature(config) if nope and family.query_temperature else None
    if temperature is not None:
        options["query_temperature"] = {
            "floor_scale": temperature.floor_scale,
            "attn_scale": temperature.attn_scale,
        }
    if options and form != "gqa":
        raise ValueError(
            f"Llama 4's {', '.join(options)} is RotaryGroupQueryAttention's: use form='gqa'."
        )
    return options


def _heads(config: dict) -> tuple[int, int]:
    """`(query heads, key-value heads)` of the config."""
    heads_key = "num_attention_heads" if "num_attention_heads" in config else "n_head"
    heads = positive_int(config, heads_key)
    key_value_heads = heads
    if config.get("num_key_value_heads") is not None:
        key_value_heads = positive_int(config, "num_key_value_heads")
    if heads % key_value_heads:
        raise ValueError(
            f"num_attention_heads={heads} is not a multiple of num_key_value_heads="
            f"{key_value_heads}."
        )
    return heads, key_value_heads


def _heads_arguments(form: str, heads: int, key_value_heads: int, head_dim: int) -> dict:
    """The head arguments of the `form` attention layer."""
    if form == "gqa":
        return {
            "num_query_heads": heads,
            "num_key_value_heads": key_value_heads,
            "head_dim": head_dim,
        }
    if form == "mha":
        if key_value_heads != heads:
            raise ValueError(
                f"The config has {key_value_heads} key-value heads for {heads} query heads "
                "(grouped-query attention): use RotaryGroupQueryAttention."
            )
        return {"num_heads": heads, "key_dim": head_dim}
    raise ValueError(f"form must be 'gqa' or 'mha', got {short_repr(form)}.")


def attention_arguments(
    config: Any, layer_type: str | None = None, form: str = "gqa", layer_index: int | None = None
) -> dict:
    """The rotary attention arguments a transformers config describes, for one layer.

    Args:
        config, layer_type: as `rotary_arguments`.
        form: `"gqa"` gives `RotaryGroupQueryAttention`'s names (`num_query_heads`,
            `num_key_value_heads`, `head_dim`); `"mha"` gives `RotaryMultiHeadAttention`'s
            (`num_heads`, `key_dim`) and refuses a config with fewer key-value heads.
        layer_index: the decoder layer to read (its type and whether it is NoPE come from
            the config). A family with NoPE layers (SmolLM3, Llama 4, EXAONE 4) needs it
            unless `layer_type` alone says whether the layer uses RoPE.

    Returns:
        The head arguments and `rope_max_wavelength`, `rope_layout`, `rope_dim`,
        `rope_scaling` (and the M-RoPE options of a multimodal family); for a NoPE layer
        `rope_dim=0` alone. Llama 4's layers add `attention_chunk_size` (its
        `chunked_attention` layers) and `query_temperature` (its NoPE layers, with
        `attn_temperature_tuning`), as `Llama4TextAttention` does. A family whose attention
        normalizes its queries and keys (Qwen3, OLMo 2 and 3, Gemma 3, EXAONE 4, Llama 4's
        `use_qk_norm`, ...: each family's `norm`) adds `query_key_norm` and
        `query_key_norm_epsilon`; one whose norm these layers lack (Gemma 4's value norm,
        Cohere's / Phi's / StableLM's LayerNorms) is an error. `use_bias`, and where the
        config sets them `sliding_window`, `use_gate` (Qwen3-Next, Qwen3.5) and `dropout`,
        come from `configs.attention.attention_settings`, which refuses what these
        layers do not compute (Gemma 2's soft-capping, a `query_pre_attn_scalar` other than
        `head_dim`, GPT-OSS's sinks, ...).

    Example:

    >>> mistral = {"model_type": "mistral", "hidden_size": 4096, "num_attention_heads": 32,
    ...            "num_key_value_heads": 8, "rope_theta": 1000000.0}
    >>> attention_arguments(mistral)["num_key_value_heads"]
    8
    """
    text = language_config(as_dict(config))
    model_type, family = family_of(text, None)
    layer_type, nope = layer_attention(text, model_type, family, layer_type, layer_index)
    if not nope:
        rotary = rotary_arguments(config, layer_type)
    config = text
    if family.latent_attention:
        raise ValueError(
            f"{model_type} uses multi-head latent attention, which these layers are not; build "
            "a RotaryEmbedding with rotary_arguments() for its qk_rope_head_dim channels."
        )
    if config.get("attention_k_eq_v"):
        raise ValueError(
            f"This {model_type} config's global layers use their keys as values "
            "(attention_k_eq_v), which these layers do not; build their RoPE with rope_per_layer."
        )
    head_dim = head_size(config, family, layer_type)
    heads, key_value_heads = _heads(config)
    if nope:
        options = {"rope_dim": 0, **_chunk_and_temperature(config, family, layer_type, nope, form)}
    else:
        options = {
            "rope_max_wavelength": rotary["max_wavelength"],
            "rope_layout": rotary["layout"],
            "rope_dim": rotary["rotary_dim"],
            "rope_scaling": rotary["scaling"],
            **_chunk_and_temperature(config, family, layer_type, nope, form),
        }
    options.update(query_key_norm_arguments(config, model_type, family, nope))
    options.update(
        attention_settings(config, model_type, family, layer_type, layer_index, head_dim)
    )
    if not nope and "mrope_section" in rotary:  # positions (batch, sequence, 3) at the call
        options["rope_mrope_section"] = rotary["mrope_section"]
        options["rope_mrope_interleaved"] = rotary["mrope_interleaved"]
    return {**_heads_arguments(form, heads, key_value_heads, head_dim), **options}
