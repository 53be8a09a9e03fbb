"""The first steps of reading a transformers config: its dict, its language model, its family.

`as_dict` accepts a config object or dict, `language_config` takes a multimodal config's
`text_config`, `family_of` finds the family's record (or names the `model_type` it lacks),
and `head_size` is the head size of one of its layers.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from keras_posenc._checks import short_repr
from keras_posenc.configs.families import (
    COMPOSITE,
    COMPOSITE_5,
    FAMILIES,
    MAYBE_COMPOSITE,
    REFUSED,
)
from keras_posenc.configs.family import Family
from keras_posenc.configs.schedules import layer_types


def as_dict(config: Any) -> dict:
    """A transformers config object (through its `to_dict()`) or dict, as a dict."""
    if isinstance(config, Mapping):
        return dict(config)
    to_dict = getattr(config, "to_dict", None)
    if callable(to_dict):
        as_mapping = to_dict()
        if isinstance(as_mapping, Mapping):
            return dict(as_mapping)
    raise TypeError(
        "config must be a dict (a config.json) or a transformers config (with to_dict()), "
        f"got {type(config).__name__}."
    )


def language_config(config: dict) -> dict:
    """The language model's config: a multimodal config's `text_config`, else `config`."""
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


def family_of(config: dict, layout: str | None) -> tuple[str, Family]:
    """`(model_type, its record)`; with `layout`, an unknown one reads as Llama-style.

    Raises:
        ValueError: a refused family, or one with no record in `FAMILIES` and no `layout`.
    """
    model_type = config.get("model_type")
    if model_type in REFUSED:
        raise ValueError(f"{model_type} cannot be read: {REFUSED[model_type]}.")
    if model_type in FAMILIES:
        return model_type, FAMILIES[model_type]
    if layout is None:
        raise ValueError(
            f"config['model_type']={short_repr(model_type)} is not a family this reader knows: "
            "it has no record in keras_posenc.configs.families.FAMILIES (add one there); pass "
            "layout='half' or 'interleaved' (the pairing of its apply_rotary_pos_emb) to read "
            "its RoPE as a Llama-style config."
        )
    # Its attention settings are never read: attention_arguments refuses an unknown family.
    return str(model_type), Family(layout=layout, bias=False)


def positive_int(config: dict, key: str) -> int:
    """`config[key]`, which must be a positive integer (an integral float reads as one)."""
    value = config[key]
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"config[{key!r}] must be a positive integer, got {short_repr(value)}.")
    return value


def _type_head_dim(config: dict, family: Family, layer_type: str) -> int:
    """The head size of `layer_type`'s layers where the family gives it its own (Gemma 4)."""
    key, default = family.type_head_dim[layer_type]
    per_layer = config.get("per_layer_config")
    if isinstance(per_layer, Mapping) and per_layer:
        # transformers 5's to_dict(): the overrides by layer index.
        types = layer_types(config, family) or []
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
        return positive_int({"head_dim": sizes.pop()}, "head_dim")
    return positive_int({key: default, **{k: v for k, v in config.items() if v is not None}}, key)


def head_size(config: dict, family: Family, layer_type: str | None = None) -> int:
    """The head size of the config's layers (of `layer_type`'s, where the family has several).

    With multi-head latent attention, the rotated part of the head: `qk_rope_head_dim`.
    """
    if layer_type in (family.type_head_dim or {}):
        return _type_head_dim(config, family, layer_type)
    if family.head_dim is not None and "head_dim" not in config:
        return family.head_dim
    if family.latent_attention:
        return positive_int({"qk_rope_head_dim": 64, **config}, "qk_rope_head_dim")
    if config.get("head_dim") is not None:
        return positive_int(config, "head_dim")
    for width, heads in (("hidden_size", "num_attention_heads"), ("n_embd", "n_head")):
        if width in config and heads in config:
            hidden, count = positive_int(config, width), positive_int(config, heads)
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
