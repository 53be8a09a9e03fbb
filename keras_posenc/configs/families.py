"""The transformers families the config readers know: one `Family` record per `model_type`.

A new family is one record in `FAMILIES` (its fields: `keras_posenc.configs.family.Family`);
a `model_type` without one is refused, naming it. Layouts are those of each family's
`apply_rotary_pos_emb` / `rotate_half` in transformers 5, defaults those of its config class,
attention settings those of its `{Family}Attention` in transformers 5.24 (checked against
transformers by `tests/test_transformers_parity.py`, `tests/test_attention_config_keys.py`
and `tests/test_transformers_defaults_2026.py`).
"""

from __future__ import annotations

from keras_posenc.configs.attention import (
    gemma2_scores,
    gemma_bidirectional,
    gpt_oss_sinks,
    granite_multiplier,
)
from keras_posenc.configs.family import FULL, SLIDING, Family, Norm, Window
from keras_posenc.configs.schedules import (
    every_nth_full,
    exaone4_types,
    gemma4_types,
    lfm2_types,
    llama4_types,
    qwen3_next_types,
    smollm3_types,
)
from keras_posenc.configs.windows import (
    every_nth_global,
    modernbert_windows,
    qwen2_moe_windows,
    qwen2_windows,
)

_GLOBAL_LOCAL = {FULL: 1e6, SLIDING: 1e4}
# Only these families' modeling code reads `partial_rotary_factor` in transformers 5
# (checked by tests/test_transformers_parity.py and test_transformers_defaults_2026.py): phi,
# phi3, stablelm, gpt_neox, glm, glm4, qwen3_next, qwen3_5(_moe)_text, glm4_moe, minimax_m2.
_WHOLE = {"reads_partial": False}
# Biases: the config key and its config-class default, or a constant where the module
# hard-codes them.
_NO_BIAS = {"bias": {"attention_bias": False}}
_BIAS = {"bias": {"attention_bias": True}}
# Qwen2's window: the layers from max_window_layers (28) on, with use_sliding_window.
_QWEN2_WINDOW = Window(default=4096, needs_flag=True, types=qwen2_windows(28))
_VL_WINDOW = Window(default=4096, needs_flag=True, types=qwen2_windows(80))
_EVERY_LAYER = Window(layers="every")
_PER_HEAD = Norm("rms_per_head")
# Qwen3NextRMSNorm / Qwen3_5RMSNorm / Gemma3RMSNorm: `1 + weight`, weight initialized to 0.
_GEMMA_NORM = Norm("gemma_rms_per_head")
# Olmo2RMSNorm(num_heads * head_dim) on the projection, before the heads are split.
_ACROSS_HEADS = Norm("rms_across_heads", epsilon=1e-5)
_PER_HEAD_5 = Norm("rms_per_head", epsilon=1e-5)
_LFM2 = {
    "theta": 1e6,
    "positionless": ("conv",),
    "bias": False,
    "dropout": None,
    "norm": Norm("rms_per_head", "norm_eps", 1e-5),
    **_WHOLE,
}

FAMILIES: dict[str, Family] = {
    "llama": Family(**_NO_BIAS, **_WHOLE),
    "mistral": Family(bias=False, window=Window(layers="every", default=4096), **_WHOLE),
    "mixtral": Family(theta=1e6, bias=False, window=_EVERY_LAYER, **_WHOLE),
    "qwen2": Family(bias=True, window=_QWEN2_WINDOW, **_WHOLE),
    "qwen2_moe": Family(
        bias={"qkv_bias": True},
        window=Window(default=4096, needs_flag=True, types=qwen2_moe_windows),
        **_WHOLE,
    ),
    "qwen3": Family(head_dim=128, **_NO_BIAS, window=_QWEN2_WINDOW, norm=_PER_HEAD, **_WHOLE),
    # Qwen3-MoE: a window on every layer, when set.
    "qwen3_moe": Family(
        **_NO_BIAS, window=Window(layers="every", needs_flag=True), norm=_PER_HEAD, **_WHOLE
    ),
    "olmo2": Family(**_NO_BIAS, norm=_ACROSS_HEADS, **_WHOLE),
    "granite": Family(**_NO_BIAS, checks=(granite_multiplier,), **_WHOLE),
    "starcoder2": Family(bias={"use_bias": True}, window=_EVERY_LAYER, **_WHOLE),
    "phi3": Family(original_length=4096, longrope_aliases=True, bias=False, window=_EVERY_LAYER),
    "gemma": Family(head_dim=256, **_NO_BIAS, checks=(gemma_bidirectional,), **_WHOLE),
    "gemma2": Family(
        head_dim=256,
        **_NO_BIAS,
        window=Window(default=4096, types=every_nth_global(2)),
        checks=(gemma2_scores(50.0), gemma_bidirectional),
        **_WHOLE,
    ),
    "phi": Family(
        partial=0.5,
        bias=True,
        refused_norm=(
            "qk_layernorm",
            "Phi's q/k norm is a LayerNorm with a bias over each head, which these layers do "
            "not have",
        ),
    ),
    "stablelm": Family(
        partial=0.25,
        bias={"use_qkv_bias": False},
        refused_norm=(
            "qk_layernorm",
            "StableLM's q/k norm is a LayerNorm with its own weights for each head, which these "
            "layers do not have",
        ),
    ),
    "gpt_neox": Family(
        partial=0.25,
        legacy={
            "rotary_emb_base": (None, "rope_theta"),
            "rotary_pct": (None, "partial_rotary_factor"),
        },
        **_BIAS,
    ),
    "gemma3_text": Family(
        theta=_GLOBAL_LOCAL,
        legacy={
            "rope_theta": (FULL, "rope_theta"),
            "rope_local_base_freq": (SLIDING, "rope_theta"),
        },
        scaling_types=(FULL,),
        head_dim=256,
        **_NO_BIAS,
        window=Window(default=4096, types=every_nth_global(6, "sliding_window_pattern")),
        checks=(gemma2_scores(None), gemma_bidirectional),
        norm=_GEMMA_NORM,
        **_WHOLE,
    ),
    "modernbert": Family(
        theta={FULL: 160000.0, SLIDING: 1e4},
        legacy={
            "global_rope_theta": (FULL, "rope_theta"),
            "local_rope_theta": (SLIDING, "rope_theta"),
        },
        **_NO_BIAS,
        window=Window(local_attention=128, types=modernbert_windows),
        **_WHOLE,
    ),
    "cohere": Family(
        layout="interleaved",
        theta=500000.0,
        **_NO_BIAS,
        refused_norm=(
            "use_qk_norm",
            "Cohere's q/k norm is a LayerNorm (mean subtracted) with a weight per head, which "
            "these layers do not have",
        ),
        **_WHOLE,
    ),
    "glm": Family(layout="interleaved", partial=0.5, head_dim=128, **_BIAS),
    "glm4": Family(layout="interleaved", partial=0.5, head_dim=128, **_BIAS),
    # GPT-J / CodeGen: base 10000 and no scaling in their code; only rotary_dim.
    **{
        name: Family(
            layout="interleaved", fixed=True, bias=False, dropout=("attn_pdrop", 0.0), **_WHOLE
        )
        for name in ("gptj", "codegen")
    },
    "deepseek_v3": Family(
        layout="interleaved", rope_interleave="reads", latent_attention=True, **_NO_BIAS, **_WHOLE
    ),
    # As deepseek_v3, but always interleaved (its indexer's own RoPE is half-split).
    "deepseek_v32": Family(
        layout="interleaved",
        rope_interleave="ignores",
        latent_attention=True,
        layer_types=lambda config, count: ["indexed_attention"] * count,
        **_NO_BIAS,
        **_WHOLE,
    ),
    # Multimodal RoPE: the sections default in the rotary module, not in the config.
    **{
        name: Family(theta=1e6, mrope=(16, 24, 24), bias=True, window=_VL_WINDOW, **_WHOLE)
        for name in ("qwen2_vl", "qwen2_vl_text", "qwen2_5_vl", "qwen2_5_vl_text")
    },
    **{
        name: Family(
            theta=5e5,
            head_dim=128,
            mrope=(24, 20, 20),
            mrope_interleaved=True,
            **_NO_BIAS,
            norm=_PER_HEAD,
            **_WHOLE,
        )
        for name in ("qwen3_vl", "qwen3_vl_text")
    },
}
FAMILIES.update(
    {
        # The 2026 checkpoints (transformers 5.24).
        "gemma4_text": Family(
            theta={FULL: 1e6, SLIDING: 1e4},
            defaults={
                SLIDING: {"rope_type": "default", "rope_theta": 1e4},
                FULL: {
                    "rope_type": "proportional",
                    "partial_rotary_factor": 0.25,
                    "rope_theta": 1e6,
                },
            },
            head_dim=256,
            type_head_dim={FULL: ("global_head_dim", 512)},
            layer_types=gemma4_types,
            **_NO_BIAS,
            refused_norm=(
                None,
                "Gemma 4's attention also RMS-normalizes its values (v_norm, without scale), "
                "which these layers do not",
            ),
            **_WHOLE,
        ),
        "llama4_text": Family(
            layout="interleaved",
            theta=500000.0,
            head_dim=128,
            layer_types=llama4_types,
            no_rope="no_rope_layers",
            empty_no_rope_layers=True,
            **_NO_BIAS,
            # Llama4TextL2Norm(rms_norm_eps) after RoPE, on the RoPE layers only.
            norm=Norm(
                "l2_after_rope", epsilon=1e-5, flag=("use_qk_norm", True), rope_layers_only=True
            ),
            attention_chunk_size=8192,
            query_temperature=True,
            **_WHOLE,
        ),
        "smollm3": Family(
            theta=2e6,
            layer_types=smollm3_types,
            no_rope="no_rope_layers",
            **_NO_BIAS,
            window=Window(needs_flag=True),
            **_WHOLE,
        ),
        "gpt_oss": Family(
            theta=150000.0,
            head_dim=64,
            defaults={
                "rope_type": "yarn",
                "factor": 32.0,
                "beta_fast": 32.0,
                "beta_slow": 1.0,
                "truncate": False,
                "original_max_position_embeddings": 4096,
            },
            layer_types=every_nth_full(2),
            **_BIAS,
            window=Window(default=128),
            checks=(gpt_oss_sinks,),
            **_WHOLE,
        ),
        "qwen3_next": Family(
            partial=0.25,
            head_dim=256,
            layer_types=qwen3_next_types,
            positionless=("linear_attention",),
            **_NO_BIAS,
            gated=True,
            norm=_GEMMA_NORM,
        ),
        **{
            name: Family(
                partial=0.25,
                head_dim=256,
                mrope=(11, 11, 10),
                mrope_interleaved=True,
                layer_types=qwen3_next_types,
                positionless=("linear_attention",),
                **_NO_BIAS,
                gated=True,
                norm=_GEMMA_NORM,
            )
            for name in ("qwen3_5_text", "qwen3_5_moe_text")
        },
        "olmo3": Family(
            theta={FULL: 500000.0, SLIDING: 500000.0},
            legacy={"rope_theta": (FULL, "rope_theta")},
            scaling_types=(FULL,),
            layer_types=every_nth_full(4),
            **_NO_BIAS,
            window=Window(default=4096),
            norm=_ACROSS_HEADS,
            **_WHOLE,
        ),
        # Its q/k norm on every layer, its global NoPE layers included.
        "exaone4": Family(
            layer_types=exaone4_types,
            no_rope="global",
            bias=False,
            window=Window(default=4096),
            norm=_PER_HEAD_5,
            **_WHOLE,
        ),
        "seed_oss": Family(
            head_dim=128,
            bias={"attention_bias": True, "attention_out_bias": False},
            dropout=("attention_dropout", 0.1),
            **_WHOLE,
        ),
        "ernie4_5": Family(
            layout="interleaved",
            theta=500000.0,
            head_dim=128,
            bias={"use_bias": False},
            dropout=None,
            **_WHOLE,
        ),
        "ernie4_5_moe": Family(
            layout="interleaved", theta=500000.0, bias={"use_bias": False}, dropout=None, **_WHOLE
        ),
        "glm4_moe": Family(
            partial=0.5,
            **_NO_BIAS,
            norm=Norm("rms_per_head", epsilon=1e-5, flag=("use_qk_norm", False)),
        ),
        # query_layernorm / key_layernorm on the rotated queries and keys.
        **{
            name: Family(
                ntk_alpha=True,
                **_NO_BIAS,
                norm=Norm("rms_per_head_after_rope", epsilon=1e-5),
                **_WHOLE,
            )
            for name in ("hunyuan_v1_dense", "hunyuan_v1_moe")
        },
        "apertus": Family(
            theta=12e6,
            defaults={
                "rope_type": "llama3",
                "rope_theta": 12e6,
                "factor": 8.0,
                "original_max_position_embeddings": 8192,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
            },
            **_NO_BIAS,
            norm=_PER_HEAD_5,
            **_WHOLE,
        ),
        "minimax_m2": Family(
            theta=5e6,
            head_dim=128,
            rotary_dim_key=True,
            bias=False,
            norm=Norm("rms_across_heads"),
        ),
        # LFM2: attention layers and convolutions (Lfm2MoeConfig makes no layer_types).
        "lfm2": Family(layer_types=lfm2_types, **_LFM2),
        "lfm2_moe": Family(**_LFM2),
    }
)
# Families whose RoPE these layers cannot describe, with the reason.
REFUSED = {
    "deepseek_v4": (
        "DeepSeek-V4 rotates its compressed key/value states with a second RoPE of its own "
        "('compress' parameters) inside its compressed attention; a RotaryEmbedding on queries "
        "and keys does not describe that"
    ),
}
# Configs that hold the language model's config under `text_config`.
COMPOSITE = ("gemma3",)
# Configs that hold it under `text_config` in transformers 5 and at the top level in the
# config.json files of transformers 4.
MAYBE_COMPOSITE = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl")
# Configs of transformers 5 only, whose language model is always under `text_config`.
COMPOSITE_5 = ("gemma4", "llama4", "qwen3_5", "qwen3_5_moe")
