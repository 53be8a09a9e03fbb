"""Qwen2 and Qwen3 (keras_hub's `QwenCausalLM`, alias `Qwen2CausalLM`; `Qwen3CausalLM`).

Llama-style blocks with q/k/v biases (Qwen2) or per-head q/k norms (Qwen3), and an
optional sliding window. keras_hub 0.32's Qwen2 attention with its window tests
`cache_update_index`'s truth in Python (`cache_update_index if cache_update_index else
0` in `QwenAttention._compute_attention`), which a traced graph cannot do: its reference
generation runs eagerly, with the same arithmetic.
"""

from __future__ import annotations

from keras_posenc.keras_hub.family import HubFamily
from keras_posenc.keras_hub.llama_style import LlamaStyle


def _qwen2_window(attention) -> int | None:
    return attention.sliding_window_size if attention.use_sliding_window_attention else None


def _qwen2_tests_the_index(causal_lm) -> bool:
    return bool(getattr(causal_lm.backbone, "use_sliding_window_attention", False))


_QWEN2_BLOCKS = LlamaStyle(norms=("QwenLayerNorm",), window=_qwen2_window)
QWEN2 = HubFamily(
    causal_lm="QwenCausalLM",
    aliases=("Qwen2CausalLM",),
    backbone="QwenBackbone",
    read_block=_QWEN2_BLOCKS.read_block,
    read_keys=frozenset(
        {
            "num_query_heads",
            "rope_max_wavelength",
            "rope_scaling_factor",
            "tie_word_embeddings",
            "use_sliding_window_attention",
            "sliding_window_size",
        }
    ),
    norms=_QWEN2_BLOCKS.norms,
    eager_reference=_qwen2_tests_the_index,
)

_QWEN3_BLOCKS = LlamaStyle(
    norms=("Qwen3LayerNorm",), window=lambda attention: attention.sliding_window_size or None
)
QWEN3 = HubFamily(
    causal_lm="Qwen3CausalLM",
    backbone="Qwen3Backbone",
    read_block=_QWEN3_BLOCKS.read_block,
    read_keys=frozenset(
        {
            "num_query_heads",
            "head_dim",
            "rope_max_wavelength",
            "rope_scaling_factor",
            "tie_word_embeddings",
            "sliding_window_size",
        }
    ),
    norms=_QWEN3_BLOCKS.norms,
)
