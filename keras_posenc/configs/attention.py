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

from keras_posenc.configs.family import Family
from keras_posenc.configs.windows import layer_window, refuse


def _use_bias(config: dict, family: Family) -> bool:
    rule = family.bias
    if isinstance(rule, bool):
        return rule
    return any(bool(config.get(key, default)) for key, default in rule.items())


def gemma2_scores(softcapping: float | None):
    """Gemma 2 / 3's logit soft-capping (default `softcapping`) and `query_pre_attn_scalar`."""

    def check(config: dict, model_type: str, head_dim: int) -> None:
        cap = config.get("attn_logit_softcapping", softcapping)
        if cap is not None:
            refuse(
                model_type,
                "attn_logit_softcapping",
                cap,
                "Gemma 2 soft-caps its attention logits (cap * tanh(logits / cap))",
                "A config with attn_logit_softcapping=null reads.",
            )
        scalar = config.get("query_pre_attn_scalar", 256)
        if scalar != head_dim:
            refuse(
                model_type,
                "query_pre_attn_scalar",
                scalar,
                f"its attention scale is query_pre_attn_scalar ** -0.5, not head_dim ({head_dim}) "
                "** -0.5",
                "A config whose query_pre_attn_scalar equals head_dim reads.",
            )

    return check


def gemma_bidirectional(config: dict, model_type: str, head_dim: int) -> None:
    """Gemma's `use_bidirectional_attention`."""
    if config.get("use_bidirectional_attention"):
        refuse(
            model_type,
            "use_bidirectional_attention",
            config["use_bidirectional_attention"],
            "it attends both ways, with its sliding window widened to a symmetric one",
            "Remove it (causal attention) to read the config.",
        )


def granite_multiplier(config: dict, model_type: str, head_dim: int) -> None:
    """Granite's `attention_multiplier`, its attention scale."""
    multiplier = config.get("attention_multiplier", 1.0)
    if not math.isclose(multiplier, head_dim**-0.5, rel_tol=1e-7):
        refuse(
            model_type,
            "attention_multiplier",
            multiplier,
            f"Granite's attention scale is attention_multiplier, not head_dim ({head_dim}) ** -0.5",
            f"Only attention_multiplier={head_dim**-0.5!r} reads.",
        )


def gpt_oss_sinks(config: dict, model_type: str, head_dim: int) -> None:
    """GPT-OSS's attention sinks, which every config of it has."""
    raise ValueError(
        "GPT-OSS's attention adds a learned sink logit per head (`sinks`) to every softmax, "
        "which these layers do not compute, so the attention would give other outputs; "
        "build its RoPE with RotaryEmbedding.from_transformers_config."
    )


def attention_settings(
    config: dict,
    model_type: str,
    family: Family,
    layer_type: str | None,
    index: int | None,
    head_dim: int,
) -> dict:
    """`use_bias`, and `sliding_window` / `use_gate` / `dropout` where set, of one layer.

    Args:
        config: the language model's config dict.
        model_type: its `model_type`, and `family` its record in
            `keras_posenc.configs.families.FAMILIES`.
        layer_type, index: the layer's type and decoder index (either may be None).
        head_dim: the layer's head size.

    Raises:
        ValueError: a setting that changes the output and these layers do not compute.
    """
    for check in family.checks:
        check(config, model_type, head_dim)
    if family.gated and config.get("attn_output_gate", True) is not True:
        refuse(
            model_type,
            "attn_output_gate",
            config["attn_output_gate"],
            "transformers 5.24 ignores it and always gates the output",
            "Remove the key (the gate is read).",
        )
    settings = {"use_bias": _use_bias(config, family)}
    window = layer_window(config, model_type, family, layer_type, index)
    if window is not None:
        settings["sliding_window"] = int(window)
    if family.gated:
        settings["use_gate"] = True
    if family.dropout is not None:
        dropout = config.get(*family.dropout)
        if dropout:
            settings["dropout"] = float(dropout)  # training only, as transformers
    return settings
