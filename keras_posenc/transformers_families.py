"""The transformers model families `transformers_config` reads, and how each reads RoPE.

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


_GLOBAL_LOCAL = {FULL: 1e6, SLIDING: 1e4}
# Only these families' modeling code reads `partial_rotary_factor` in transformers 5
# (checked by tests/test_transformers_parity.py): phi, phi3, stablelm, gpt_neox, glm, glm4.
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
# Configs that hold the language model's config under `text_config`.
COMPOSITE = ("gemma3",)
# Configs that hold it under `text_config` in transformers 5 and at the top level in the
# config.json files of transformers 4.
MAYBE_COMPOSITE = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl")
