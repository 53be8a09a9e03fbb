"""Which decoder layers of a transformers config take positions, and of which layer type.

`layer_types(config, family)` is the config's `layer_types`, or the list its config class
makes when a `config.json` leaves it out (the family's `layer_types`, one of the functions
here); `positionless_layers` says, per layer, whether it uses no RoPE: NoPE layers (SmolLM3
and Llama 4's `no_rope_layers`, EXAONE 4's global layers), linear-attention layers
(Qwen3-Next, Qwen3.5) and convolutions (LFM2). Each rule is the one of the family's
transformers 5 config class and attention code.
"""

from __future__ import annotations

from collections.abc import Callable

from keras_posenc._checks import short_repr
from keras_posenc.configs.family import FULL, SLIDING, Family, LayerTypes


def _every(interval: int, other: str, each: str) -> Callable[[int], str]:
    return lambda index: other if (index + 1) % interval else each


def every_nth_full(interval: int) -> LayerTypes:
    """Layer types with every `interval`-th layer full attention, the others sliding."""
    return lambda config, count: [_every(interval, SLIDING, FULL)(i) for i in range(count)]


def gemma4_types(config: dict, count: int) -> list[str]:
    """Gemma4TextConfig's: five sliding layers, then a full one; the last always full."""
    types = [_every(6, SLIDING, FULL)(index) for index in range(count)]
    return types[:-1] + [FULL] if types else types  # its last layer is always global


def exaone4_types(config: dict, count: int) -> list[str] | None:
    """Exaone4Config's: `sliding_window_pattern` (every 4th layer full), or all full."""
    if config.get("sliding_window", 4096) is None:  # Exaone4Config's default window
        return [FULL] * count
    pattern = config.get("sliding_window_pattern", 4)
    if not isinstance(pattern, int) or isinstance(pattern, bool) or pattern <= 0:
        return None  # a string pattern: the config must list its layer_types
    return [_every(pattern, SLIDING, FULL)(index) for index in range(count)]


def llama4_types(config: dict, count: int) -> list[str]:
    """Llama4TextConfig's: its RoPE layers chunked (with a chunk size), its NoPE layers full."""
    chunked = config.get("attention_chunk_size", 8192) is not None
    return [
        "chunked_attention" if rope and chunked else FULL
        for rope in _no_rope_flags(config, count, empty_is_default=True)
    ]


def lfm2_types(config: dict, count: int) -> list[str]:
    """Lfm2Config's: attention at `full_attn_idxs`, convolutions elsewhere."""
    full = config.get("full_attn_idxs")
    full = range(count) if full is None else full
    return [FULL if index in full else "conv" for index in range(count)]


def smollm3_types(config: dict, count: int) -> list[str]:
    """SmolLM3Config's: its NoPE layers sliding where it has a window, the others full."""
    sliding = config.get("use_sliding_window", False) and config.get("sliding_window") is not None
    return [
        SLIDING if sliding and not rope else FULL
        for rope in _no_rope_flags(config, count, empty_is_default=False)
    ]


def qwen3_next_types(config: dict, count: int) -> list[str]:
    """Qwen3NextConfig's: every `full_attention_interval`-th layer full, the others linear."""
    every = _every(config.get("full_attention_interval", 4), "linear_attention", FULL)
    return [every(index) for index in range(count)]


def layer_count(config: dict) -> int | None:
    """`num_hidden_layers` (or GPT-style `n_layer`), None when the config has neither."""
    for key in ("num_hidden_layers", "n_layer"):
        value = config.get(key)
        if value is not None:
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(
                    f"config[{key!r}] must be a positive integer, got {short_repr(value)}."
                )
            return value
    return None


def layer_types(config: dict, family: Family) -> list[str] | None:
    """The type of each layer: the config's `layer_types`, else its config class's default."""
    types = config.get("layer_types")
    count = layer_count(config)
    if types is not None:
        if not isinstance(types, (list, tuple)) or not all(isinstance(t, str) for t in types):
            raise ValueError(
                f"config['layer_types'] must be a list of strings, got {short_repr(types)}."
            )
        if count is not None and len(types) != count:
            raise ValueError(
                f"config['layer_types'] has {len(types)} entries for num_hidden_layers={count}."
            )
        return list(types)
    if family.layer_types is None or count is None:
        return None
    return family.layer_types(config, count)


def _no_rope_flags(config: dict, count: int, empty_is_default: bool) -> list[bool]:
    """SmolLM3 / Llama 4: `no_rope_layers[i]` is 1 where layer i uses RoPE, 0 for NoPE.

    A null list (or, with `empty_is_default`, an empty one) takes one NoPE layer in
    `no_rope_layer_interval`.
    """
    flags = config.get("no_rope_layers")
    if flags is None or (empty_is_default and not flags):
        interval = config.get("no_rope_layer_interval", 4)
        if isinstance(interval, bool) or not isinstance(interval, int) or interval <= 0:
            raise ValueError(
                "config['no_rope_layer_interval'] must be a positive integer, got "
                f"{short_repr(interval)}."
            )
        return [bool((index + 1) % interval) for index in range(count)]
    if not isinstance(flags, (list, tuple)) or not all(flag in (0, 1) for flag in flags):
        raise ValueError(
            "config['no_rope_layers'] must be a list of 0 / 1 per layer (1: the layer uses "
            f"RoPE), got {short_repr(flags)}."
        )
    if len(flags) < count:
        raise ValueError(
            f"config['no_rope_layers'] has {len(flags)} entries for {count} layers; it needs one "
            "per layer."
        )
    return [bool(flag) for flag in flags[:count]]


def positionless_types(config: dict, family: Family) -> tuple[str, ...]:
    """The layer types whose layers use no RoPE."""
    types = tuple(family.positionless)
    if family.no_rope == "global":
        # EXAONE 4: "global NoPE" wherever there is a sliding window.
        default = None if family.window is None else family.window.default
        window = config.get("sliding_window", default)
        if window is not None:
            types += (FULL,)
    return types


def positionless_layers(config: dict, model_type: str, family: Family) -> list[bool]:
    """Per layer: True where it uses no RoPE."""
    count = layer_count(config)
    if count is None:
        raise ValueError("The config needs 'num_hidden_layers' to list its layers.")
    types = layer_types(config, family)
    without = positionless_types(config, family)
    if types is None:
        if without:
            raise ValueError(
                f"A {model_type} config needs 'layer_types' (which of its layers are "
                f"{' / '.join(without)}); this one has none."
            )
        types = [None] * count
    nope = [layer_type in without for layer_type in types]
    if family.no_rope == "no_rope_layers":
        rope = _no_rope_flags(config, count, family.empty_no_rope_layers)
        nope = [old or not uses for old, uses in zip(nope, rope, strict=True)]
    return nope


def _refuse_unknown_layer(model_type: str, layer_type: str | None) -> None:
    chosen = f"layer_type={layer_type!r}" if layer_type is not None else "the config alone"
    raise ValueError(
        f"In this {model_type} config {chosen} does not say whether the layer uses RoPE or "
        "is a NoPE layer (keras_posenc.rope_per_layer lists them): pass layer_index= (the "
        "decoder layer's index), or a layer_type= whose layers are all one or the other."
    )


def layer_attention(
    config: dict, model_type: str, family: Family, layer_type: str | None, index: int | None
) -> tuple[str | None, bool]:
    """One attention layer's type and whether it is a NoPE layer, by index or by type.

    A family with NoPE layers (SmolLM3, Llama 4, EXAONE 4) needs `index` where its layer
    type alone does not say: the same rule for all of them.
    """
    count = layer_count(config)
    if index is not None:
        if isinstance(index, bool) or not isinstance(index, int) or index < 0:
            raise ValueError(f"layer_index must be an integer >= 0, got {short_repr(index)}.")
        if count is None:
            raise ValueError("The config needs 'num_hidden_layers' to find layer_index.")
        if index >= count:
            raise ValueError(
                f"layer_index={index} is not a layer of this config (num_hidden_layers={count})."
            )
    elif family.no_rope is None:
        return layer_type, False
    elif count is None:
        if family.no_rope == "global" and layer_type is not None:
            return layer_type, layer_type in positionless_types(config, family)
        _refuse_unknown_layer(model_type, layer_type)
    types = layer_types(config, family) or [None] * count
    nope = positionless_layers(config, model_type, family)
    if index is not None:
        if layer_type is not None and layer_type != types[index]:
            raise ValueError(
                f"layer_type={short_repr(layer_type)} differs from the config's: layer {index} "
                f"is {types[index]}."
            )
        if types[index] in family.positionless:
            raise ValueError(
                f"Layer {index} is {types[index]}, not an attention layer these layers are."
            )
        return types[index], nope[index]
    kinds = {no for kind, no in zip(types, nope, strict=True) if layer_type in (None, kind)}
    if len(kinds) > 1:
        _refuse_unknown_layer(model_type, layer_type)
    return layer_type, kinds.pop() if kinds else False
