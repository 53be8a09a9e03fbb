"""The query / key norms of a transformers config's attention, as transformers 5.24 applies them.

`query_key_norm_arguments` gives the `query_key_norm` / `query_key_norm_epsilon` arguments of
a rotary attention layer for one layer of a config, read from each family's attention module
(its norm's form, the config key of its epsilon and that key's default in the config class).
A family whose norm these layers do not compute is refused, naming the family and the
setting: attention built without it would give other outputs, silently.
"""

from __future__ import annotations

import dataclasses

from keras_posenc._checks import short_repr


@dataclasses.dataclass(frozen=True)
class _Norm:
    kind: str  # a key of keras_posenc.query_key_norm.QUERY_KEY_NORMS
    epsilon_key: str = "rms_norm_eps"
    epsilon: float = 1e-6  # the config class's default
    flag: tuple[str, bool] | None = None  # (config key, its default): the norm is optional
    rope_layers_only: bool = False  # not in NoPE layers (Llama 4)


_PER_HEAD = _Norm("rms_per_head")
_GEMMA = _Norm("gemma_rms_per_head")
# By `model_type` (the language model's): `{Family}Attention.__init__` / `forward` in 5.24.
NORMS = {
    **dict.fromkeys(("qwen3", "qwen3_moe", "qwen3_vl", "qwen3_vl_text"), _PER_HEAD),
    # Qwen3NextRMSNorm / Qwen3_5RMSNorm: Gemma's `1 + weight`, weight initialized to 0.
    **dict.fromkeys(("qwen3_next", "qwen3_5_text", "qwen3_5_moe_text"), _GEMMA),
    "gemma3_text": _GEMMA,
    # Olmo2RMSNorm(num_heads * head_dim) on the projection, before the heads are split.
    "olmo2": _Norm("rms_across_heads", epsilon=1e-5),
    "olmo3": _Norm("rms_across_heads", epsilon=1e-5),
    "minimax_m2": _Norm("rms_across_heads"),
    # Every layer, its global NoPE layers included.
    "exaone4": _Norm("rms_per_head", epsilon=1e-5),
    "apertus": _Norm("rms_per_head", epsilon=1e-5),
    **dict.fromkeys(("lfm2", "lfm2_moe"), _Norm("rms_per_head", "norm_eps", 1e-5)),
    "glm4_moe": _Norm("rms_per_head", epsilon=1e-5, flag=("use_qk_norm", False)),
    # query_layernorm / key_layernorm on the rotated queries and keys.
    **dict.fromkeys(
        ("hunyuan_v1_dense", "hunyuan_v1_moe"), _Norm("rms_per_head_after_rope", epsilon=1e-5)
    ),
    # Llama4TextL2Norm(rms_norm_eps) after RoPE, on the RoPE layers only.
    "llama4_text": _Norm(
        "l2_after_rope", epsilon=1e-5, flag=("use_qk_norm", True), rope_layers_only=True
    ),
}
# Norms these layers do not compute: `model_type -> (config key or None: always, why)`.
REFUSED_NORMS = {
    "gemma4_text": (
        None,
        "Gemma 4's attention also RMS-normalizes its values (v_norm, without scale), which "
        "these layers do not",
    ),
    "cohere": (
        "use_qk_norm",
        "Cohere's q/k norm is a LayerNorm (mean subtracted) with a weight per head, which "
        "these layers do not have",
    ),
    "phi": (
        "qk_layernorm",
        "Phi's q/k norm is a LayerNorm with a bias over each head, which these layers do not have",
    ),
    "stablelm": (
        "qk_layernorm",
        "StableLM's q/k norm is a LayerNorm with its own weights for each head, which these "
        "layers do not have",
    ),
}


def _epsilon(config: dict, norm: _Norm) -> float:
    value = config.get(norm.epsilon_key, norm.epsilon)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(
            f"config[{norm.epsilon_key!r}] must be a positive number (the q/k norms' "
            f"epsilon), got {short_repr(value)}."
        )
    return float(value)


def query_key_norm_arguments(config: dict, model_type: str, nope: bool) -> dict:
    """`{"query_key_norm", "query_key_norm_epsilon"}` of one layer, or `{}` without q/k norm.

    Args:
        config: the language model's config dict.
        model_type: its `model_type` (a key of `transformers_families.FAMILIES`).
        nope: whether the layer uses no RoPE.

    Raises:
        ValueError: the family's q/k norm is one these layers do not compute.
    """
    if model_type in REFUSED_NORMS:
        key, why = REFUSED_NORMS[model_type]
        if key is None or config.get(key):
            setting = "" if key is None else f" ({key}={short_repr(config[key])})"
            fix = "" if key is None else f"; a config with {key}=false reads"
            raise ValueError(
                f"This {model_type} config normalizes its queries and keys{setting}: {why}, "
                f"so the attention would give other outputs{fix}."
            )
        return {}
    norm = NORMS.get(model_type)
    if norm is None or (norm.rope_layers_only and nope):
        return {}
    if norm.flag is not None and not config.get(*norm.flag):
        return {}
    return {"query_key_norm": norm.kind, "query_key_norm_epsilon": _epsilon(config, norm)}
