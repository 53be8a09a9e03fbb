"""Mistral (keras_hub's `MistralCausalLM`): Llama-style blocks with a sliding window.

keras_hub keeps the window (the backbone's `sliding_window`) only under a private name
of its attention layer (`private.mistral_sliding_window`).
"""

from __future__ import annotations

from keras_posenc.keras_hub import private
from keras_posenc.keras_hub.family import HubFamily
from keras_posenc.keras_hub.llama_style import LlamaStyle

_BLOCKS = LlamaStyle(norms=("MistralLayerNormalization",), window=private.mistral_sliding_window)
MISTRAL = HubFamily(
    causal_lm="MistralCausalLM",
    backbone="MistralBackbone",
    read_block=_BLOCKS.read_block,
    read_keys=frozenset(
        {
            "num_query_heads",
            "rope_max_wavelength",
            "rope_scaling_factor",
            "sliding_window",
            "head_dim",
        }
    ),
    norms=_BLOCKS.norms,
)
