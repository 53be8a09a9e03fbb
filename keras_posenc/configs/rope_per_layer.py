"""One `RotaryEmbedding` (or None) per decoder layer of a transformers config.

Checkpoints of 2025-26 mix layers: RoPE with other parameters per layer type (Gemma 3 and 4,
OLMo 3), NoPE layers (SmolLM3, Llama 4, EXAONE 4), linear-attention layers (Qwen3-Next,
Qwen3.5) and convolutions (LFM2). `rope_per_layer` reads the whole schedule; Llama 4's
query scale on its NoPE layers is `attention_temperature`.
"""

from __future__ import annotations

from typing import Any

from keras_posenc.configs.language_model import as_dict, family_of, language_config
from keras_posenc.configs.schedules import layer_types, positionless_layers
from keras_posenc.layers.rotary import RotaryEmbedding


def rope_per_layer(config: Any, **overrides) -> list[RotaryEmbedding | None]:
    """The RoPE of each decoder layer a transformers config describes.

    Args:
        config: a transformers config or its dict (`config.json` of transformers 4 or 5,
            or `to_dict()`); the families of `keras_posenc.configs.families.FAMILIES`.
        **overrides: further `RotaryEmbedding` arguments for every layer (`sequence_axis`,
            `positions_from_mask`, ...).

    Returns:
        A list with one entry per decoder layer (`num_hidden_layers`): the
        `RotaryEmbedding` of that layer's queries and keys (from its layer type's RoPE
        parameters and head size), or None where the layer uses no positions (NoPE, linear
        attention, convolution). Layers of one type get equal, separate layers.

    Example:

    >>> smollm3 = {"model_type": "smollm3", "hidden_size": 2048, "num_attention_heads": 16,
    ...            "num_hidden_layers": 4, "no_rope_layers": [1, 1, 1, 0]}
    >>> [layer is None for layer in rope_per_layer(smollm3)]
    [False, False, False, True]
    """
    text = language_config(as_dict(config))
    model_type, family = family_of(text, overrides.get("layout"))
    nope = positionless_layers(text, model_type, family)
    types = layer_types(text, family) or [None] * len(nope)
    layers = []
    for layer_type, positionless in zip(types, nope, strict=True):
        if positionless:
            layers.append(None)
            continue
        layers.append(RotaryEmbedding.from_transformers_config(text, layer_type, **overrides))
    return layers
