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

from keras_posenc.axes import checked_mrope_section
from keras_posenc.rope_scaling import rope_parameters
from keras_posenc.scaling_keys import checked_scaling, short_repr
from keras_posenc.transformers_families import (  # noqa: F401  FAMILIES: re-exported
    COMPOSITE,
    FAMILIES,
    FULL,
    MAYBE_COMPOSITE,
    SLIDING,
    Family,
)

_ROPE_KEY = re.compile("rope|rotary")
_EARLY_CHECK_DIM = 2**14
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
    if config.get("model_type") in COMPOSITE + MAYBE_COMPOSITE:
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


def _head_dim(config: dict, model_type: str) -> int:
    family = FAMILIES.get(model_type)
    if family is not None and family.head_dim is not None and "head_dim" not in config:
        return family.head_dim
    if model_type == "deepseek_v3":
        # Only the qk_rope_head_dim channels of each head (q_pe, k_pe) are rotated.
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
    if model_type == "deepseek_v3":
        consumed.add("rope_interleave")
        interleave = config.get("rope_interleave", True)
        if not isinstance(interleave, bool):
            raise ValueError(
                f"config['rope_interleave'] must be true or false, got {short_repr(interleave)}."
            )
        return "interleaved" if interleave else "half"
    return family.layout


def _is_nested(parameters: Mapping) -> bool:
    return bool(parameters) and all(
        v is None or isinstance(v, Mapping) for v in parameters.values()
    )


def _rope_entries(config: dict, family: Family, consumed: set) -> dict[str | None, dict | None]:
    """The rope parameter dicts (transformers 5 form) by layer type, None for all layers."""
    consumed.update({"rope_parameters", "rope_scaling"})
    parameters = config.get("rope_parameters") or None
    scaling = config.get("rope_scaling") or None
    if parameters is not None and scaling is not None and parameters != scaling:
        raise ValueError(
            "The config has both 'rope_parameters' and 'rope_scaling', and they differ: keep one "
            "(transformers 5 reads 'rope_scaling' first)."
        )
    parameters = scaling if scaling is not None else parameters
    if parameters is not None and not isinstance(parameters, Mapping):
        raise ValueError(f"config's RoPE parameters must be a dict, got {short_repr(parameters)}.")
    per_type = isinstance(family.theta, Mapping)
    if parameters is not None and _is_nested(parameters):
        entries = {key: None if v is None else dict(v) for key, v in parameters.items()}
    elif per_type:
        # transformers-4 form of a local/global family: one rope_scaling, per-type thetas.
        entries = {key: {} for key in family.theta}
        for key in family.scaling_types or entries:
            entries[key].update(parameters or {})
    else:
        entries = {None: dict(parameters or {})}
    live = {name: entry for name, entry in entries.items() if entry is not None}
    # transformers' order: the family's own keys, then the generic top-level ones, then the
    # family's defaults. A generic key that the family's own keys replace is not read by
    # transformers: it is refused, naming the family's own key.
    for key, (layer_type, rope_key) in family.legacy.items():
        consumed.add(key)
        if config.get(key) is not None:
            for name, entry in live.items():
                if layer_type is None or name == layer_type:
                    entry.setdefault(rope_key, config[key])
    for key in ("rope_theta", "partial_rotary_factor"):
        own = [name for name, (_, rope_key) in family.legacy.items() if rope_key == key]
        if own and key not in family.legacy:
            if config.get(key) is not None:
                names = " / ".join(map(repr, own))
                raise ValueError(
                    f"This family reads {names}, not {key!r} (transformers ignores it): give "
                    f"the value as {names}, or remove {key!r}."
                )
            continue
        consumed.add(key)
        if config.get(key) is not None and key not in family.legacy:
            for entry in live.values():
                entry.setdefault(key, config[key])
    for name, entry in live.items():
        theta = family.theta.get(name) if per_type else family.theta
        if theta is not None:
            entry.setdefault("rope_theta", theta)
        entry.setdefault("partial_rotary_factor", family.partial)
    return entries


def _layer_types(config: dict, entries: dict) -> list[str]:
    if None not in entries:
        return sorted(entries)
    types = config.get("layer_types")
    return sorted(set(types)) if isinstance(types, list) else []


def _chosen(entries: dict, types: list[str], layer_type: str | None) -> tuple[str | None, dict]:
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


def _phi3_names(scaling: dict) -> None:
    """Phi3Config's renaming, in place: early Phi-3 configs call longrope "su" (or "yarn")."""
    names = {scaling.get("type"), scaling.get("rope_type")}
    if "su" in names and "original_max_position_embeddings" not in scaling:
        # Phi3Config validates before it renames, and copies a top-level length only into
        # the types it knows by then: an "su" without its own length is refused.
        raise ValueError(
            "phi3 rope_scaling type 'su' needs 'original_max_position_embeddings' inside "
            "rope_scaling (transformers' Phi3Config refuses it without, even with a top-level "
            "one): add it there, or name the type 'longrope'."
        )
    for key in ("type", "rope_type"):
        if scaling.get(key) in ("su", "yarn"):
            scaling[key] = "longrope"


def _scaling(
    entry: dict, config: dict, family: Family, original_top: bool
) -> tuple[float, float, dict | None]:
    """`(theta, partial_rotary_factor, scaling dict or None)` of one rope parameter dict."""
    scaling = dict(entry)
    for key in ("mrope_section", "mrope_interleaved"):
        scaling.pop(key, None)  # read by _mrope
    if config.get("model_type") == "phi3":
        _phi3_names(scaling)
    if scaling.get("rope_type", scaling.get("type")) == "mrope":
        # transformers 4's Qwen2-VL configs name the plain frequencies "mrope".
        scaling.pop("type", None)
        scaling["rope_type"] = "default"
    if "type" in scaling and scaling.setdefault("rope_type", scaling["type"]) == scaling["type"]:
        del scaling["type"]  # when they differ, checked_scaling names both
    rope_type = scaling.setdefault("rope_type", "default")
    if "rope_theta" not in scaling:
        raise ValueError("The config gives no 'rope_theta' for this layer.")
    if rope_type in ("llama3", "yarn", "longrope"):
        # As transformers' standardize_rope_params: a top-level original length (Phi-3, whose
        # config class always has one) wins over the rope parameters' own.
        top = config.get("original_max_position_embeddings", family.original_length)
        if original_top and top is not None:
            scaling["original_max_position_embeddings"] = top
        elif "max_position_embeddings" in config:
            scaling.setdefault(
                "original_max_position_embeddings", config["max_position_embeddings"]
            )
    if rope_type == "dynamic" or (
        rope_type in ("yarn", "longrope") and scaling.get("factor") is None
    ):
        # transformers takes this one from the config, not from the rope parameters.
        if "max_position_embeddings" not in config:
            raise ValueError(
                f"rope_type {rope_type!r} needs the config's 'max_position_embeddings'."
            )
        top = config["max_position_embeddings"]
        if scaling.setdefault("max_position_embeddings", top) != top:
            raise ValueError(
                "The rope parameters' 'max_position_embeddings' differs from the config's; "
                "transformers uses the config's: remove the inner one."
            )
    scaling = checked_scaling(scaling)
    theta = scaling.pop("rope_theta")
    partial = scaling.pop("partial_rotary_factor", 1.0)
    return theta, partial, None if rope_type == "default" else scaling


def _mrope(entry: dict, family: Family) -> dict:
    """`mrope_section` / `mrope_interleaved` arguments of a multimodal RoPE family, else {}."""
    if family.mrope is None:
        if "mrope_section" in entry:
            raise ValueError(
                "The config has an 'mrope_section', but its model_type uses 1D RoPE; "
                "give the model_type of the multimodal model."
            )
        return {}
    interleaved = entry.get("mrope_interleaved", family.mrope_interleaved)
    if bool(interleaved) != family.mrope_interleaved:
        raise ValueError(
            f"'mrope_interleaved': {interleaved!r} differs from what this family's code does "
            f"({family.mrope_interleaved}); transformers ignores it: remove it."
        )
    try:
        section = checked_mrope_section(entry.get("mrope_section", family.mrope), None)
    except ValueError as error:
        # An integer is not per-axis pair counts (transformers would split cos/sin into
        # chunks of that size instead): say the form, with this family's default.
        raise ValueError(
            f"The config's {str(error).rstrip('.')}: give a list of pair counts per axis "
            f"(temporal, height, width) such as {list(family.mrope)}, summing to half the "
            "rotated channels."
        ) from None
    return {"mrope_section": section, "mrope_interleaved": family.mrope_interleaved}


def _whole_head(model_type: str, partial: float, scaling: dict | None, head_dim: int) -> float:
    """The factor of a family whose attention rotates the whole head (`reads_partial` false)."""
    covered = int(head_dim * partial)
    if scaling is not None and covered != head_dim:
        # Its default frequencies ignore the factor; the scaled ones (transformers' shared
        # rope functions) read it, and their cos/sin no longer match the head.
        raise ValueError(
            f"partial_rotary_factor={partial}: {model_type}'s attention rotates the whole head, "
            f"but transformers' {scaling['rope_type']!r} frequencies would cover {covered} of its "
            f"{head_dim} channels and the transformers model fails: remove it (transformers "
            "ignores it without scaling)."
        )
    return 1.0


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
        layer_type: for configs with RoPE per layer type (Gemma 3, ModernBERT:
            `"full_attention"` / `"sliding_attention"`), the type to read; required when the
            config has several.
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
    config = _language_config(_as_dict(config))
    model_type, family = _family(config, layout)
    consumed = {"model_type", "qk_rope_head_dim"}
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
        entries = _rope_entries(config, family, consumed)
        _unread(config, consumed)
        _, entry = _chosen(entries, _layer_types(config, entries), layer_type)
        theta, partial, scaling = _scaling(entry, config, family, original_top=None in entries)
        mrope = _mrope(entry, family)
        if not family.reads_partial:
            partial = _whole_head(model_type, partial, scaling, head_dim)
        rotary_dim = int(head_dim * partial)
    if rotary_dim > head_dim or rotary_dim % 2:
        raise ValueError(
            f"The config rotates {rotary_dim} of {head_dim} channels per head; that must be an "
            "even number no larger than the head."
        )
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
        **({} if family.fixed else mrope),
    }


_MLA = ("deepseek_v3",)


def attention_arguments(config: Any, layer_type: str | None = None, form: str = "gqa") -> dict:
    """The rotary attention arguments a transformers config describes.

    Args:
        config, layer_type: as `rotary_arguments`.
        form: `"gqa"` gives `RotaryGroupQueryAttention`'s names (`num_query_heads`,
            `num_key_value_heads`, `head_dim`); `"mha"` gives `RotaryMultiHeadAttention`'s
            (`num_heads`, `key_dim`) and refuses a config with fewer key-value heads.

    Returns:
        The head arguments and `rope_max_wavelength`, `rope_layout`, `rope_dim`,
        `rope_scaling` (and the M-RoPE options of a multimodal family).

    Example:

    >>> mistral = {"model_type": "mistral", "hidden_size": 4096, "num_attention_heads": 32,
    ...            "num_key_value_heads": 8, "rope_theta": 1000000.0}
    >>> attention_arguments(mistral)["num_key_value_heads"]
    8
    """
    rotary = rotary_arguments(config, layer_type)
    config = _language_config(_as_dict(config))
    model_type = config.get("model_type")
    if model_type in _MLA:
        raise ValueError(
            f"{model_type} uses multi-head latent attention, which these layers are not; build "
            "a RotaryEmbedding with rotary_arguments() for its qk_rope_head_dim channels."
        )
    head_dim = _head_dim(config, model_type)
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
    if "mrope_section" in rotary:
        raise ValueError(
            f"{model_type} uses multimodal RoPE, which the attention layers do not take; build "
            "a RotaryEmbedding with from_transformers_config and apply it to q and k."
        )
    options = {
        "rope_max_wavelength": rotary["max_wavelength"],
        "rope_layout": rotary["layout"],
        "rope_dim": rotary["rotary_dim"],
        "rope_scaling": rotary["scaling"],
    }
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
