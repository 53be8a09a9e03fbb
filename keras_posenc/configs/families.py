"""The transformers model families `configs.arguments` reads, and how each reads RoPE.

Layouts are those of each family's `apply_rotary_pos_emb` / `rotate_half` in transformers 5;
defaults are those of its config class (both checked against transformers by
`tests/test_transformers_parity.py`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

FULL, SLIDING = "full_attention", "sliding_attention"


@dataclasses.dataclass(frozen=True)
class Family:
    """How transformers reads the RoPE of one `model_type`.

    Attributes:
        layout: `"half"` or `"interleaved"` channel pairing of its attention.
        theta: its default `rope_theta`, or one per layer type.
        partial: its default `partial_rotary_factor`.
        reads_partial: whether its attention applies `partial_rotary_factor`. Where not
            (most families: their modeling code never reads it), the whole head rotates: a
            factor leaves their default frequencies as they are, and makes the scaled ones,
            which the shared rope functions compute for `head_dim * factor` channels, too few
            for the head (the transformers model fails).
        legacy: transformers-4 keys it reads, mapped to `(layer type or None, rope key)`.
        scaling_types: the layer types a transformers-4 `rope_scaling` applies to (None: all).
        fixed: the family's code takes no RoPE keys but `rotary_dim` (GPT-J, CodeGen).
        head_dim: its default `head_dim` (None: `hidden_size // num_attention_heads`).
        original_length: its config class's default top-level
            `original_max_position_embeddings`, which replaces the rope parameters' own for
            llama3 / yarn / longrope frequencies (Phi-3: the attribute is always set).
        mrope: its multimodal RoPE's default `mrope_section` (None: 1D RoPE).
        mrope_interleaved: whether its M-RoPE interleaves the axes (Qwen3-VL) or chunks
            them (Qwen2-VL); fixed by the family's code, whatever the config says.
        defaults: the rope parameters its config class sets when a config gives none
            (GPT-OSS's yarn, Apertus's llama3, Gemma 4's per-type dicts).
        no_rope: how its NoPE layers are chosen: `"no_rope_layers"` (a 0/1 list per layer,
            1 = RoPE; SmolLM3, Llama 4), `"global"` (EXAONE 4: its full-attention layers,
            when the config has a sliding window), or None.
        positionless: layer types whose layers take no positions (linear attention, conv).
        type_head_dim: layer types whose head size is another key of the config, mapped to
            `(key, default)` (Gemma 4's `global_head_dim`; transformers 5's `to_dict()`
            writes it as `per_layer_config`).
        rotary_dim_key: `rotary_dim` gives the rotated channels (MiniMax-M2: read as
            `partial_rotary_factor = rotary_dim / head_dim`, as its config class does).
        ntk_alpha: a `dynamic` scaling with an `alpha` is a fixed base `θ·α^(d/(d-2))`
            (Hunyuan's NTK-alpha; its `factor` is then unused).
    """

    layout: str = "half"
    theta: float | Mapping[str, float] = 10000.0
    partial: float = 1.0
    reads_partial: bool = True
    legacy: Mapping[str, tuple[str | None, str]] = dataclasses.field(default_factory=dict)
    scaling_types: tuple[str, ...] | None = None
    fixed: bool = False
    head_dim: int | None = None
    original_length: int | None = None
    mrope: tuple[int, ...] | None = None
    mrope_interleaved: bool = False
    defaults: Mapping | None = None
    no_rope: str | None = None
    positionless: tuple[str, ...] = ()
    type_head_dim: Mapping[str, tuple[str, int]] | None = None
    rotary_dim_key: bool = False
    ntk_alpha: bool = False


_GLOBAL_LOCAL = {FULL: 1e6, SLIDING: 1e4}
# Only these families' modeling code reads `partial_rotary_factor` in transformers 5
# (checked by tests/test_transformers_parity.py and test_transformers_defaults_2026.py): phi,
# phi3, stablelm, gpt_neox, glm, glm4, qwen3_next, qwen3_5(_moe)_text, glm4_moe, minimax_m2.
_WHOLE = {"reads_partial": False}
# Layouts from each family's `apply_rotary_pos_emb` / `rotate_half` in transformers 5.
FAMILIES: dict[str, Family] = {
    **{
        name: Family(**_WHOLE)
        for name in (
            "llama",
            "mistral",
            "qwen2",
            "qwen2_moe",
            "qwen3_moe",
            "olmo2",
            "granite",
            "starcoder2",
        )
    },
    "phi3": Family(original_length=4096),
    "mixtral": Family(theta=1e6, **_WHOLE),
    "qwen3": Family(head_dim=128, **_WHOLE),
    "gemma": Family(head_dim=256, **_WHOLE),
    "gemma2": Family(head_dim=256, **_WHOLE),
    "phi": Family(partial=0.5),
    "stablelm": Family(partial=0.25),
    "gpt_neox": Family(
        partial=0.25,
        legacy={
            "rotary_emb_base": (None, "rope_theta"),
            "rotary_pct": (None, "partial_rotary_factor"),
        },
    ),
    "gemma3_text": Family(
        theta=_GLOBAL_LOCAL,
        legacy={
            "rope_theta": (FULL, "rope_theta"),
            "rope_local_base_freq": (SLIDING, "rope_theta"),
        },
        scaling_types=(FULL,),
        head_dim=256,
        **_WHOLE,
    ),
    "modernbert": Family(
        theta={FULL: 160000.0, SLIDING: 1e4},
        legacy={
            "global_rope_theta": (FULL, "rope_theta"),
            "local_rope_theta": (SLIDING, "rope_theta"),
        },
        **_WHOLE,
    ),
    "cohere": Family(layout="interleaved", theta=500000.0, **_WHOLE),
    "glm": Family(layout="interleaved", partial=0.5, head_dim=128),
    "glm4": Family(layout="interleaved", partial=0.5, head_dim=128),
    "gptj": Family(layout="interleaved", fixed=True, **_WHOLE),
    "codegen": Family(layout="interleaved", fixed=True, **_WHOLE),
    # `rope_interleave` (default true) picks the layout; see `_layout`.
    "deepseek_v3": Family(layout="interleaved", **_WHOLE),
    # Multimodal RoPE: the sections default in the rotary module, not in the config.
    **{
        name: Family(theta=1e6, mrope=(16, 24, 24), **_WHOLE)
        for name in ("qwen2_vl", "qwen2_vl_text", "qwen2_5_vl", "qwen2_5_vl_text")
    },
    **{
        name: Family(theta=5e5, head_dim=128, mrope=(24, 20, 20), mrope_interleaved=True, **_WHOLE)
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
            **_WHOLE,
        ),
        "llama4_text": Family(
            layout="interleaved", theta=500000.0, head_dim=128, no_rope="no_rope_layers", **_WHOLE
        ),
        "smollm3": Family(theta=2e6, no_rope="no_rope_layers", **_WHOLE),
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
            **_WHOLE,
        ),
        **{
            name: Family(partial=0.25, head_dim=256, positionless=("linear_attention",))
            for name in ("qwen3_next",)
        },
        **{
            name: Family(
                partial=0.25,
                head_dim=256,
                positionless=("linear_attention",),
                mrope=(11, 11, 10),
                mrope_interleaved=True,
            )
            for name in ("qwen3_5_text", "qwen3_5_moe_text")
        },
        "olmo3": Family(
            theta={FULL: 500000.0, SLIDING: 500000.0},
            legacy={"rope_theta": (FULL, "rope_theta")},
            scaling_types=(FULL,),
            **_WHOLE,
        ),
        "exaone4": Family(no_rope="global", **_WHOLE),
        "seed_oss": Family(head_dim=128, **_WHOLE),
        "ernie4_5": Family(layout="interleaved", theta=500000.0, head_dim=128, **_WHOLE),
        "ernie4_5_moe": Family(layout="interleaved", theta=500000.0, **_WHOLE),
        "glm4_moe": Family(partial=0.5),
        **{
            name: Family(ntk_alpha=True, **_WHOLE)
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
            **_WHOLE,
        ),
        # As deepseek_v3, but always interleaved (its indexer's own RoPE is half-split).
        "deepseek_v32": Family(layout="interleaved", **_WHOLE),
        "minimax_m2": Family(theta=5e6, head_dim=128, rotary_dim_key=True),
        **{
            name: Family(theta=1e6, positionless=("conv",), **_WHOLE)
            for name in ("lfm2", "lfm2_moe")
        },
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
