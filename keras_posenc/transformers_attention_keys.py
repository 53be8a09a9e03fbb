"""The attention settings of a transformers config besides heads, RoPE and q/k norms.

`attention_settings` reads, for one layer, the config keys that change the output of the
family's attention module in transformers 5.24 (its `{Family}Attention.__init__` / `forward`
and the mask its model makes): projection biases, the sliding window, Qwen3-Next / Qwen3.5's
output gate and the attention dropout. These become the Keras attention's own `use_bias`,
`sliding_window`, `use_gate` and `dropout`, whose semantics are transformers' (a causal query
`i` sees keys `j` with `i - j < sliding_window`, as `sliding_window_overlay`; the gate is
`sigmoid` of a per-head projection of the input, multiplied before the output projection).
A setting these layers do not compute (another query scale, logit soft-capping, attention
sinks, a bidirectional window) is refused, naming the family, the key and its value: an
attention built without it would give other outputs, silently. docs/configs.md has the table.
"""

from __future__ import annotations

import math

from keras_posenc._checks import short_repr
from keras_posenc.transformers_families import FULL, SLIDING
from keras_posenc.transformers_schedules import layer_count, layer_types

# Biases: `model_type -> {config key: its config-class default}` (any true: biases), or a
# constant where the module hard-codes them. `use_bias=True` gives all four projections a
# bias; where transformers has none (Qwen2's, GLM's o_proj, ...) that bias loads as zeros.
_BIAS: dict[str, dict[str, bool] | bool] = {
    **dict.fromkeys(
        (
            "llama",
            "qwen3",
            "qwen3_moe",
            "olmo2",
            "granite",
            "gemma",
            "gemma2",
            "gemma3_text",
            "cohere",
            "olmo3",
            "modernbert",
            "qwen3_vl",
            "qwen3_vl_text",
            "llama4_text",
            "smollm3",
            "qwen3_next",
            "qwen3_5_text",
            "qwen3_5_moe_text",
            "glm4_moe",
            "hunyuan_v1_dense",
            "hunyuan_v1_moe",
            "apertus",
            "deepseek_v3",
            "deepseek_v32",
            "gemma4_text",
        ),
        {"attention_bias": False},
    ),
    **dict.fromkeys(("gpt_neox", "glm", "glm4", "gpt_oss"), {"attention_bias": True}),
    "seed_oss": {"attention_bias": True, "attention_out_bias": False},
    "qwen2_moe": {"qkv_bias": True},
    "starcoder2": {"use_bias": True},
    **dict.fromkeys(("ernie4_5", "ernie4_5_moe"), {"use_bias": False}),
    "stablelm": {"use_qkv_bias": False},
    **dict.fromkeys(
        ("qwen2", "qwen2_vl", "qwen2_vl_text", "qwen2_5_vl", "qwen2_5_vl_text", "phi"), True
    ),
    **dict.fromkeys(
        ("mistral", "mixtral", "phi3", "exaone4", "minimax_m2", "lfm2", "lfm2_moe", "gptj"),
        False,
    ),
    "codegen": False,
}
# A window on every layer: `model_type -> sliding_window default` (Mistral, Phi-3, ...).
_EVERY_LAYER = {"mistral": 4096, "mixtral": None, "starcoder2": None, "phi3": None}
# A window on the `sliding_attention` layers: `model_type -> sliding_window default`.
_PER_TYPE = {
    **dict.fromkeys(
        ("qwen2", "qwen3", "qwen2_vl", "qwen2_vl_text", "qwen2_5_vl", "qwen2_5_vl_text"), 4096
    ),
    "qwen2_moe": 4096,
    "gemma2": 4096,
    "gemma3_text": 4096,
    "olmo3": 4096,
    "exaone4": 4096,
    "smollm3": None,
    "gpt_oss": 128,
    "modernbert": 64,
}
# Families whose window needs `use_sliding_window` (their config class nulls it otherwise).
_NEEDS_FLAG = {"qwen2", "qwen3", "qwen3_moe", "qwen2_vl", "qwen2_vl_text", "qwen2_5_vl"}
_NEEDS_FLAG |= {"qwen2_5_vl_text", "qwen2_moe", "smollm3"}
_MAX_WINDOW_LAYERS = {"qwen2": 28, "qwen3": 28, "qwen2_moe": 28}
_GATED = ("qwen3_next", "qwen3_5_text", "qwen3_5_moe_text")
_GEMMA = ("gemma", "gemma2", "gemma3_text")


def _refuse(model_type: str, key: str, value, why: str, fix: str) -> None:
    raise ValueError(
        f"This {model_type} config has {key}={short_repr(value)}: {why}, which these layers do "
        f"not compute, so the attention would give other outputs. {fix}"
    )


def _use_bias(config: dict, model_type: str) -> bool:
    rule = _BIAS[model_type]
    if isinstance(rule, bool):
        return rule
    return any(bool(config.get(key, default)) for key, default in rule.items())


def _default_types(config: dict, model_type: str, count: int | None) -> list[str] | None:
    """The config class's layer types where `transformers_schedules` has none (windows only)."""
    if config.get("layer_types") is not None or count is None:
        return layer_types(config, model_type)
    window = _window_value(config, model_type)
    if model_type == "qwen2_moe":
        interval = _MAX_WINDOW_LAYERS["qwen2_moe"]
        last = config.get("max_window_layers", interval)
        flag = config.get("use_sliding_window", False)
        return [SLIDING if (i + 1) % 2 and i < last and flag else FULL for i in range(count)]
    if model_type in _PER_TYPE and model_type.startswith("qwen"):
        first = config.get("max_window_layers", _MAX_WINDOW_LAYERS.get(model_type, 80))
        return [SLIDING if window is not None and i >= first else FULL for i in range(count)]
    every = {"gemma2": 2, "gemma3_text": config.get("sliding_window_pattern", 6)}
    if model_type in every:
        return [SLIDING if (i + 1) % every[model_type] else FULL for i in range(count)]
    if model_type == "modernbert":
        interval = config.get("global_attn_every_n_layers", 3)
        return [SLIDING if i % interval else FULL for i in range(count)]
    return layer_types(config, model_type)


def _window_value(config: dict, model_type: str) -> int | None:
    """The config's `sliding_window` as its config class leaves it (None: no window)."""
    if model_type == "modernbert":
        return config.get("local_attention", 128) // 2
    default = _EVERY_LAYER.get(model_type, _PER_TYPE.get(model_type))
    window = config.get("sliding_window", default)
    if model_type in _NEEDS_FLAG and not config.get("use_sliding_window", False):
        return None
    if window is not None and (
        isinstance(window, bool) or not isinstance(window, int) or window <= 0
    ):
        raise ValueError(
            f"config['sliding_window'] must be a positive integer or null, got "
            f"{short_repr(window)}."
        )
    return window


def _window(config: dict, model_type: str, layer_type: str | None, index: int | None):
    """The sliding window of one layer, or None."""
    if model_type in _EVERY_LAYER or model_type == "qwen3_moe":
        return _window_value(config, model_type)  # Qwen3-MoE: every layer, when set
    if model_type not in _PER_TYPE:
        return None
    window = _window_value(config, model_type)
    types = _default_types(config, model_type, layer_count(config))
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
    if model_type == "modernbert":
        _refuse(
            model_type,
            "local_attention",
            config.get("local_attention", 128),
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


def _refuse_unsupported(config: dict, model_type: str, head_dim: int) -> None:
    if model_type in ("gemma2", "gemma3_text"):
        cap = config.get("attn_logit_softcapping", 50.0 if model_type == "gemma2" else None)
        if cap is not None:
            _refuse(
                model_type,
                "attn_logit_softcapping",
                cap,
                "Gemma 2 soft-caps its attention logits (cap * tanh(logits / cap))",
                "A config with attn_logit_softcapping=null reads.",
            )
        scalar = config.get("query_pre_attn_scalar", 256)
        if scalar != head_dim:
            _refuse(
                model_type,
                "query_pre_attn_scalar",
                scalar,
                f"its attention scale is query_pre_attn_scalar ** -0.5, not head_dim ({head_dim}) "
                "** -0.5",
                "A config whose query_pre_attn_scalar equals head_dim reads.",
            )
    if model_type in _GEMMA and config.get("use_bidirectional_attention"):
        _refuse(
            model_type,
            "use_bidirectional_attention",
            config["use_bidirectional_attention"],
            "it attends both ways, with its sliding window widened to a symmetric one",
            "Remove it (causal attention) to read the config.",
        )
    if model_type == "granite":
        multiplier = config.get("attention_multiplier", 1.0)
        if not math.isclose(multiplier, head_dim**-0.5, rel_tol=1e-7):
            _refuse(
                model_type,
                "attention_multiplier",
                multiplier,
                f"Granite's attention scale is attention_multiplier, not head_dim ({head_dim}) "
                "** -0.5",
                f"Only attention_multiplier={head_dim**-0.5!r} reads.",
            )
    if model_type == "gpt_oss":
        raise ValueError(
            "GPT-OSS's attention adds a learned sink logit per head (`sinks`) to every softmax, "
            "which these layers do not compute, so the attention would give other outputs; "
            "build its RoPE with RotaryEmbedding.from_transformers_config."
        )
    if model_type in _GATED and config.get("attn_output_gate", True) is not True:
        _refuse(
            model_type,
            "attn_output_gate",
            config["attn_output_gate"],
            "transformers 5.24 ignores it and always gates the output",
            "Remove the key (the gate is read).",
        )


def attention_settings(
    config: dict, model_type: str, layer_type: str | None, index: int | None, head_dim: int
) -> dict:
    """`use_bias`, and `sliding_window` / `use_gate` / `dropout` where set, of one layer.

    Args:
        config: the language model's config dict.
        model_type: its `model_type` (a key of `transformers_families.FAMILIES`).
        layer_type, index: the layer's type and decoder index (either may be None).
        head_dim: the layer's head size.

    Raises:
        ValueError: a setting that changes the output and these layers do not compute.
    """
    _refuse_unsupported(config, model_type, head_dim)
    settings = {"use_bias": _use_bias(config, model_type)}
    window = _window(config, model_type, layer_type, index)
    if window is not None:
        settings["sliding_window"] = int(window)
    if model_type in _GATED:
        settings["use_gate"] = True
    key = "attn_pdrop" if model_type in ("gptj", "codegen") else "attention_dropout"
    dropout = config.get(key, 0.1 if model_type == "seed_oss" else 0.0)  # SeedOssConfig's
    if model_type not in ("ernie4_5", "ernie4_5_moe", "lfm2", "lfm2_moe") and dropout:
        settings["dropout"] = float(dropout)  # training only, as transformers
    return settings
