"""Phi-3 (keras_hub's `Phi3CausalLM`): Llama-style blocks under public names, su RoPE.

Its `Phi3SuScaledRotaryEmbedding` ("su" scaling) is transformers' `longrope`; it
switches to its long factors past its pretraining length, which no one table gives
(refused there by `rotary_layers.exact_tables`).
"""

from __future__ import annotations

from keras_posenc.keras_hub.family import HubFamily, RotaryReader
from keras_posenc.keras_hub.llama_style import LlamaStyle
from keras_posenc.keras_hub.rotary_layers import checked_wavelength

# The sublayers of `Phi3Decoder` and `Phi3Attention`, by `LlamaStyle` part.
_PARTS = dict(
    attention_norm="pre_attention_layernorm",
    attention="attention",
    mlp_norm="post_attention_layernorm",
    gate="feedforward_gate_dense",
    up="feedforward_intermediate_dense",
    down="feedforward_output_dense",
    query="query_dense",
    key="key_dense",
    value="value_dense",
    output="output_dense",
)


def _part(layer, part: str):
    return getattr(layer, _PARTS[part])


def _su_settings(layer, owner: str) -> tuple[float, dict]:
    wavelength = checked_wavelength(layer, owner)
    return wavelength, {
        "rope_type": "longrope",
        "short_factor": [float(f) for f in layer.inverese_freq_short_factor],
        "long_factor": [float(f) for f in layer.inverese_freq_long_factor],
        "original_max_position_embeddings": int(layer.pretraining_sequence_length),
        "max_position_embeddings": int(layer.max_sequence_length),
    }


_BLOCKS = LlamaStyle(norms=("Phi3LayerNorm",), part=_part)
PHI3 = HubFamily(
    causal_lm="Phi3CausalLM",
    backbone="Phi3Backbone",
    read_block=_BLOCKS.read_block,
    read_keys=frozenset(
        {
            "num_query_heads",
            "max_sequence_length",
            "pretraining_sequence_length",
            "rope_max_wavelength",
            "rope_scaling_type",
            "rope_scaling_short_factor",
            "rope_scaling_long_factor",
        }
    ),
    norms=_BLOCKS.norms,
    rotaries={"Phi3SuScaledRotaryEmbedding": RotaryReader(_su_settings)},
)
