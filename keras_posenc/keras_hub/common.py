"""Readers every family shares: arrays, keras_hub's RMSNorms."""

from __future__ import annotations

import keras
import numpy as np

from keras_posenc.export.decoder.description import Norm
from keras_posenc.export.decoder.weight_arrays import weight_array
from keras_posenc.export.errors import ExportError

# `x * rsqrt(mean(x²) + epsilon) * scale`, in float32.
_RMS_NORMS = (
    "LlamaLayerNorm",
    "MistralLayerNormalization",
    "QwenLayerNorm",
    "Qwen3LayerNorm",
    "Phi3LayerNorm",
    "GptOssLayerNormalization",
)
# Gemma's: `x / sqrt(mean(x²) + epsilon) * (1 + scale)`; `1 + scale` rounds to the same
# float32 as keras_hub's, so it is stored as the scale.
_GEMMA_NORM = "RMSNormalization"


def array(variable) -> np.ndarray:
    """`weight_arrays.weight_array`: the variable's float32 value, a view where it can be."""
    return weight_array(variable)


def rms_norm(layer, owner: str) -> Norm:
    kind, module = type(layer).__name__, type(layer).__module__
    # Gemma 4's and Keras's own (SmolLM3's) RMSNormalization multiply by the scale itself.
    plain = module.startswith(("keras_hub.src.models.gemma4.", "keras.src.layers."))
    if kind in _RMS_NORMS or (kind == _GEMMA_NORM and plain):
        if plain and kind == _GEMMA_NORM and getattr(layer, "axis", -1) not in (-1, [-1]):
            raise ExportError(f"{owner}: its norm {layer.name!r} is not over the last axis.")
        epsilon = keras.backend.epsilon() if layer.epsilon is None else layer.epsilon
        return Norm(array(layer.scale), float(epsilon))
    if kind == _GEMMA_NORM and module.startswith("keras_hub.src.models.gemma"):
        return Norm(np.float32(1) + array(layer.scale), float(layer.epsilon))
    raise ExportError(f"{owner}: its norm {kind} is not an RMSNorm the export reads.")


def unscaled_norm(layer, width: int, owner: str) -> Norm:
    """Gemma 4's `Gemma4VNorm` (an RMSNorm without a learned scale) as a scale of ones."""
    kind = type(layer).__name__
    if kind != "Gemma4VNorm" or not type(layer).__module__.startswith(
        "keras_hub.src.models.gemma4"
    ):
        raise ExportError(f"{owner}: its value norm {kind} is not one the export reads.")
    return Norm(np.ones(width, np.float32), float(layer.epsilon))
