"""Llama and Llama 3 (keras_hub's `LlamaCausalLM`, `Llama3CausalLM`): Llama-style blocks.

Their RoPE is keras_hub's `LlamaRotaryEmbedding`: plain, or Llama 3's frequency blend
(transformers' `llama3` scaling). Its `position_scaling_factor` is kept by keras_hub but
never applied, so a value other than 1 is refused rather than exported as either.
"""

from __future__ import annotations

from keras_posenc.export.errors import ExportError
from keras_posenc.keras_hub.family import HubFamily, RotaryReader
from keras_posenc.keras_hub.llama_style import LlamaStyle
from keras_posenc.keras_hub.rotary_layers import checked_wavelength

_BLOCKS = LlamaStyle(norms=("LlamaLayerNorm",))
# The keys of keras_hub 0.32's Llama backbone configs the readers read.
READ_KEYS = frozenset(
    {
        "num_query_heads",
        "rope_max_wavelength",
        "rope_position_scaling_factor",
        "rope_frequency_adjustment_factor",
        "rope_low_freq_factor",
        "rope_high_freq_factor",
        "rope_pretraining_sequence_length",
        "tie_word_embeddings",
    }
)


def _llama_rotary_settings(layer, owner: str) -> tuple[float, dict | None]:
    wavelength = checked_wavelength(layer, owner)
    if layer.position_scaling_factor != 1.0:
        raise ExportError(
            f"{owner}: rope_position_scaling_factor={layer.position_scaling_factor} is "
            "not exported: keras_hub's LlamaRotaryEmbedding keeps it but never applies "
            "it (its inverse frequencies ignore it), so what the model computes and what "
            "its config says differ. Set it to 1.0, or use llama3 scaling."
        )
    if layer.low_freq_factor is None:
        return wavelength, None
    return wavelength, {
        "rope_type": "llama3",
        "factor": float(layer.frequency_adjustment_factor),
        "low_freq_factor": float(layer.low_freq_factor),
        "high_freq_factor": float(layer.high_freq_factor),
        "original_max_position_embeddings": int(layer.pretraining_sequence_length),
    }


_ROTARIES = {"LlamaRotaryEmbedding": RotaryReader(_llama_rotary_settings)}
LLAMA = HubFamily(
    causal_lm="LlamaCausalLM",
    backbone="LlamaBackbone",
    read_block=_BLOCKS.read_block,
    read_keys=READ_KEYS,
    norms=_BLOCKS.norms,
    rotaries=_ROTARIES,
)
LLAMA3 = HubFamily(
    causal_lm="Llama3CausalLM",
    backbone="Llama3Backbone",
    read_block=_BLOCKS.read_block,
    read_keys=READ_KEYS,
    norms=_BLOCKS.norms,
    rotaries=_ROTARIES,
)
