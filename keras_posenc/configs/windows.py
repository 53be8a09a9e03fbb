"""The sliding window of one layer of a transformers config, as its family's attention has it.

`layer_window` reads a family's `Window` (its config class's default, whether the window needs
`use_sliding_window`, and which layers have it) into the window of one layer, or None. The
functions here that make layer types are the window-only rules of config classes (Qwen2's
`max_window_layers`, Gemma 2's alternation), named by the families' records.
"""

from __future__ import annotations

from keras_posenc._checks import short_repr
from keras_posenc.configs.family import FULL, SLIDING, Family, Window, WindowTypes
from keras_posenc.configs.schedules import layer_count, layer_types


def refuse(model_type: str, key: str, value, why: str, fix: str) -> None:
    """Raises the error of an attention setting these layers do not compute."""
    raise ValueError(
        f"This {model_type} config has {key}={short_repr(value)}: {why}, which these layers do "
        f"not compute, so the attention would give other outputs. {fix}"
    )


def qwen2_windows(max_window_layers: int) -> WindowTypes:
    """Qwen2-style: the layers from `max_window_layers` on slide (where there is a window)."""

    def types(config: dict, count: int, window: int | None) -> list[str]:
        first = config.get("max_window_layers", max_window_layers)
        return [SLIDING if window is not None and i >= first else FULL for i in range(count)]

    return types


def qwen2_moe_windows(config: dict, count: int, window: int | None) -> list[str]:
    """Qwen2-MoE: every other layer below `max_window_layers` slides, with the flag."""
    last = config.get("max_window_layers", 28)
    flag = config.get("use_sliding_window", False)
    return [SLIDING if (i + 1) % 2 and i < last and flag else FULL for i in range(count)]


def every_nth_global(interval: int, key: str | None = None) -> WindowTypes:
    """Gemma 2 / 3: every `interval`-th layer (or `config[key]`-th) global, the others slide."""

    def types(config: dict, count: int, window: int | None) -> list[str]:
        every = interval if key is None else config.get(key, interval)
        return [SLIDING if (i + 1) % every else FULL for i in range(count)]

    return types


def modernbert_windows(config: dict, count: int, window: int | None) -> list[str]:
    """ModernBERT: every `global_attn_every_n_layers`-th layer global, from the first."""
    interval = config.get("global_attn_every_n_layers", 3)
    return [SLIDING if i % interval else FULL for i in range(count)]


def _window_value(config: dict, rule: Window) -> int | None:
    """The config's `sliding_window` as its config class leaves it (None: no window)."""
    if rule.local_attention is not None:
        return config.get("local_attention", rule.local_attention) // 2
    window = config.get("sliding_window", rule.default)
    if rule.needs_flag and not config.get("use_sliding_window", False):
        return None
    if window is not None and (
        isinstance(window, bool) or not isinstance(window, int) or window <= 0
    ):
        raise ValueError(
            f"config['sliding_window'] must be a positive integer or null, got "
            f"{short_repr(window)}."
        )
    return window


def _window_types(config: dict, family: Family, window: int | None) -> list[str] | None:
    """The config's layer types, or those its config class makes for the window."""
    count = layer_count(config)
    if config.get("layer_types") is not None or count is None or family.window.types is None:
        return layer_types(config, family)
    return family.window.types(config, count, window)


def layer_window(
    config: dict, model_type: str, family: Family, layer_type: str | None, index: int | None
) -> int | None:
    """The sliding window of one layer (by type, or by decoder index), or None."""
    rule = family.window
    if rule is None:
        return None
    window = _window_value(config, rule)
    if rule.layers == "every":
        return window
    types = _window_types(config, family, window)
    if index is not None and types is not None:
        layer_type = types[index]
    if layer_type is None:
        kinds = set(types or [])
        if kinds == {FULL} or (window is None and SLIDING not in kinds):
            return None
        if kinds != {SLIDING}:
            raise ValueError(
                f"This {model_type} config has sliding-window layers (sliding_window="
                f"{short_repr(window)}) and others, or does not list them: pass layer_index= "
                "(the decoder layer) or layer_type='sliding_attention' / 'full_attention'."
            )
        layer_type = SLIDING
    if layer_type != SLIDING:
        return None
    if rule.local_attention is not None:
        refuse(
            model_type,
            "local_attention",
            config.get("local_attention", rule.local_attention),
            "ModernBERT's sliding layers attend bidirectionally within local_attention / 2 "
            "tokens on either side",
            "Build its global (full_attention) layers only.",
        )
    if window is None:
        raise ValueError(
            f"This {model_type} config's layer is {SLIDING}, but the config gives no "
            "sliding_window (or has use_sliding_window false): give both, or make the layer "
            "full_attention."
        )
    return window
