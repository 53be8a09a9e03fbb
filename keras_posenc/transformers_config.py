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
from collections.abc import Mapping
from typing import Any

from keras_posenc._checks import short_repr
from keras_posenc.rope import rope_parameters
from keras_posenc.transformers_attention_keys import attention_settings
from keras_posenc.transformers_axial import axial_arguments, is_axial
from keras_posenc.transformers_entries import (
    entry_arguments,
    mrope_arguments,
    rope_entries,
    whole_head_factor,
)
from keras_posenc.transformers_families import (  # noqa: F401  FAMILIES: re-exported
    COMPOSITE,
    COMPOSITE_5,
    FAMILIES,
    FULL,
    MAYBE_COMPOSITE,
    REFUSED,
    SLIDING,
    Family,
)
from keras_posenc.transformers_norms import query_key_norm_arguments
from keras_posenc.transformers_schedules import layer_attention, layer_types, positionless_types

_ROPE_KEY = re.compile("rope|rotary")
_EARLY_CHECK_DIM = 2**14
# Multi-head latent attention: only the qk_rope_head_dim channels of each head rotate.
_MLA = ("deepseek_v3", "deepseek_v32")
# RoPE-named keys that are not RoPE parameters.
_NOT_ROPE = {"qk_nope_head_dim", "use_rope"}


def _as_dict(config: Any) -> dict:
    if isinstance(config, Mapping):
        return dict(config)
    to_dict = getattr(config, "to_dict", None)
    if callable(to_dict):
        as_dict = to_dict()
        if isinstance(as_dict, Mapping):
            return dict(as_dict)
    raise TypeError(
        "config must be a dict (a config.json) or a transformers config (with to_dict()), "
        f"got {type(config).__name__}."
    )


def _language_config(config: dict) -> dict:
    if config.get("model_type") in MAYBE_COMPOSITE and "text_config" not in config:
        return config
    if config.get("model_type") in COMPOSITE + COMPOSITE_5 + MAYBE_COMPOSITE:
        if not isinstance(config.get("text_config"), Mapping):
            raise ValueError(
                f"A {config['model_type']!r} config keeps its language model under "
                "'text_config'; this one has none."
            )
        text = dict(config["text_config"])
        text.setdefault("model_type", f"{config['model_type']}_text")
        return text
    return config


def _family(config: dict, layout: str | None) -> tuple[str, Family]:
    model_type = config.get("model_type")
    if model_type in REFUSED:
        raise ValueError(f"{model_type} cannot be read: {REFUSED[model_type]}.")
    if model_type in FAMILIES:
        return model_type, FAMILIES[model_type]
    if layout is None:
        raise ValueError(
            f"config['model_type']={short_repr(model_type)} is not a family this reader knows "
            "(keras_posenc.transformers_config.FAMILIES); pass layout='half' or 'interleaved' "
            "(the pairing of its apply_rotary_pos_emb) to read it as a Llama-style config."
        )
    return str(model_type), Family(layout=layout)


def _positive_int(config: dict, key: str) -> int:
    value = config[key]
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"config[{key!r}] must be a positive integer, got {short_repr(value)}.")
    return value


def _type_head_dim(config: dict, model_type: str, layer_type: str) -> int:
    """The head size of `layer_type`'s layers where the family gives it its own (Gemma 4)."""
    key, default = FAMILIES[model_type].type_head_dim[layer_type]
    per_layer = config.get("per_layer_config")
    if isinstance(per_layer, Mapping) and per_layer:
        # transformers 5's to_dict(): the overrides by layer index.
        types = layer_types(config, model_type) or []
        sizes = {
            overrides.get("head_dim")
            for index, overrides in per_layer.items()
            if int(index) < len(types) and types[int(index)] == layer_type
        }
        if len(sizes) != 1 or None in sizes:
            raise ValueError(
                f"The config's per_layer_config gives the {layer_type} layers head sizes "
                f"{sorted(map(str, sizes))}; a RotaryEmbedding needs one."
            )
        return _positive_int({"head_dim": sizes.pop()}, "head_dim")
    return _positive_int({key: default, **{k: v for k, v in config.items() if v is not None}}, key)


def _head_dim(config: dict, model_type: str, layer_type: str | None = None) -> int:
    family = FAMILIES.get(model_type)
    if family is not None and layer_type in (family.type_head_dim or {}):
        return _type_head_dim(config, model_type, layer_type)
    if family is not None and family.head_dim is not None and "head_dim" not in config:
        return family.head_dim
    if model_type in _MLA:
        return _positive_int({"qk_rope_head_dim": 64, **config}, "qk_rope_head_dim")
    if config.get("head_dim") is not None:
        return _positive_int(config, "head_dim")
    for width, heads in (("hidden_size", "num_attention_heads"), ("n_embd", "n_head")):
        if width in config and heads in config:
            hidden, count = _positive_int(config, width), _positive_int(config, heads)
            if hidden % count:
                raise ValueError(
                    f"config[{width!r}]={hidden} is not a multiple of config[{heads!r}]={count}; "
                    "the config needs 'head_dim'."
                )
            return hidden // count
    raise ValueError(
        "The config needs 'head_dim', or 'hidden_size' and 'num_attention_heads' (or 'n_embd' "
        "and 'n_head')."
    )


def _layout(config: dict, model_type: str, family: Family, consumed: set) -> str:
    if model_type == "deepseek_v32":
        consumed.add("rope_interleave")
        if config.get("rope_interleave", True) is not True:
            raise ValueError(
                "deepseek_v32's attention always interleaves its RoPE pairs (transformers ignores "
                f"'rope_interleave'), got rope_interleave={short_repr(config['rope_interleave'])}: "
                "remove it."
            )
    if model_type == "deepseek_v3":
        consumed.add("rope_interleave")
        interleave = config.get("rope_interleave", True)
        if not isinstance(interleave, bool):
            raise ValueError(
                f"config['rope_interleave'] must be true or false, got {short_repr(interleave)}."
            )
        return "interleaved" if interleave else "half"
    return family.layout


def _layer_types(config: dict, model_type: str, entries: dict) -> list[str]:
    if None not in entries:
        return sorted(entries)
    return sorted(set(layer_types(config, model_type) or []))


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
    config = _as_dict(config)
    if is_axial(config):
        return axial_arguments(config, layer_type, layout)
    config = _language_config(config)
    model_type, family = _family(config, layout)
    consumed = {"model_type", "qk_rope_head_dim"}
    if family.no_rope == "no_rope_layers":
        consumed.update({"no_rope_layers", "no_rope_layer_interval"})  # rope_per_layer's
    family_layout = _layout(config, model_type, family, consumed)
    if layout is not None and model_type in FAMILIES and layout != family_layout:
        raise ValueError(
            f"layout={layout!r} differs from {model_type}'s own pairing {family_layout!r}."
        )
    head_dim = _head_dim(config, model_type)
    if family.fixed:
        # GPT-J / CodeGen: base 10000 and no scaling in their code; only rotary_dim.
        consumed.update({"rotary_dim", "partial_rotary_factor"})
        _unread(config, consumed)
        # Their config's default is 64; a null makes their code build its tables for the
        # whole width, not the head: refused by _positive_int.
        rotary_dim = _positive_int({"rotary_dim": 64, **config}, "rotary_dim")
        theta, scaling = 10000.0, None
    else:
        entries = rope_entries(config, family, consumed, head_dim)
        _unread(config, consumed)
        types = _layer_types(config, model_type, entries)
        without = positionless_types(config, model_type, family)
        chosen, entry = _chosen(entries, types, layer_type, without)
        if chosen in (family.type_head_dim or {}):
            head_dim = _head_dim(config, model_type, chosen)
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


def _llama4_options(config: dict, layer_type: str | None, nope: bool, form: str) -> dict:
    """Llama 4's chunked mask (its `chunked_attention` layers) and NoPE query temperature."""
    if config.get("model_type") != "llama4_text":
        return {}
    from keras_posenc.attention_temperature import attention_temperature

    options = {}
    if layer_type == "chunked_attention":
        chunk = {"attention_chunk_size": 8192, **config}
        options["attention_chunk_size"] = _positive_int(chunk, "attention_chunk_size")
    temperature = attention_temperature(config) if nope else None
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
        `use_qk_norm`, ...: `transformers_norms.NORMS`) adds `query_key_norm` and
        `query_key_norm_epsilon`; one whose norm these layers lack (Gemma 4's value norm,
        Cohere's / Phi's / StableLM's LayerNorms) is an error. `use_bias`, and where the
        config sets them `sliding_window`, `use_gate` (Qwen3-Next, Qwen3.5) and `dropout`,
        come from `transformers_attention_keys.attention_settings`, which refuses what these
        layers do not compute (Gemma 2's soft-capping, a `query_pre_attn_scalar` other than
        `head_dim`, GPT-OSS's sinks, ...).

    Example:

    >>> mistral = {"model_type": "mistral", "hidden_size": 4096, "num_attention_heads": 32,
    ...            "num_key_value_heads": 8, "rope_theta": 1000000.0}
    >>> attention_arguments(mistral)["num_key_value_heads"]
    8
    """
    text = _language_config(_as_dict(config))
    model_type, family = _family(text, None)
    layer_type, nope = layer_attention(text, model_type, family, layer_type, layer_index)
    if not nope:
        rotary = rotary_arguments(config, layer_type)
    config = text
    if model_type in _MLA:
        raise ValueError(
            f"{model_type} uses multi-head latent attention, which these layers are not; build "
            "a RotaryEmbedding with rotary_arguments() for its qk_rope_head_dim channels."
        )
    if config.get("attention_k_eq_v"):
        raise ValueError(
            f"This {model_type} config's global layers use their keys as values "
            "(attention_k_eq_v), which these layers do not; build their RoPE with rope_per_layer."
        )
    head_dim = _head_dim(config, model_type, layer_type)
    heads_key = "num_attention_heads" if "num_attention_heads" in config else "n_head"
    heads = _positive_int(config, heads_key)
    key_value_heads = heads
    if config.get("num_key_value_heads") is not None:
        key_value_heads = _positive_int(config, "num_key_value_heads")
    if heads % key_value_heads:
        raise ValueError(
            f"num_attention_heads={heads} is not a multiple of num_key_value_heads="
            f"{key_value_heads}."
        )
    if nope:
        options = {"rope_dim": 0, **_llama4_options(config, layer_type, nope, form)}
    else:
        options = {
            "rope_max_wavelength": rotary["max_wavelength"],
            "rope_layout": rotary["layout"],
            "rope_dim": rotary["rotary_dim"],
            "rope_scaling": rotary["scaling"],
            **_llama4_options(config, layer_type, nope, form),
        }
    options.update(query_key_norm_arguments(config, model_type, nope))
    options.update(attention_settings(config, model_type, layer_type, layer_index, head_dim))
    if not nope and "mrope_section" in rotary:  # positions (batch, sequence, 3) at the call
        options["rope_mrope_section"] = rotary["mrope_section"]
        options["rope_mrope_interleaved"] = rotary["mrope_interleaved"]
    if form == "gqa":
        heads_arguments = {
            "num_query_heads": heads,
            "num_key_value_heads": key_value_heads,
            "head_dim": head_dim,
        }
    elif form == "mha":
        if key_value_heads != heads:
            raise ValueError(
                f"The config has {key_value_heads} key-value heads for {heads} query heads "
                "(grouped-query attention): use RotaryGroupQueryAttention."
            )
        heads_arguments = {"num_heads": heads, "key_dim": head_dim}
    else:
        raise ValueError(f"form must be 'gqa' or 'mha', got {short_repr(form)}.")
    return {**heads_arguments, **options}
