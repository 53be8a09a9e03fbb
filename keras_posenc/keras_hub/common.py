"""Readers every family shares: arrays, keras_hub's RMSNorms."""

from __future__ import annotations

import keras
import numpy as np

from keras_posenc.export.decoder.description import Norm
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
    return np.asarray(keras.ops.convert_to_numpy(variable), np.float32)


def rms_norm(layer, owner: str) -> Norm:
    kind = type(layer).__name__
    if kind in _RMS_NORMS:
        return Norm(array(layer.scale), float(layer.epsilon))
    if kind == _GEMMA_NORM and type(layer).__module__.startswith("keras_hub.src.models.gemma"):
        return Norm(np.float32(1) + array(layer.scale), float(layer.epsilon))
    raise ExportError(f"{owner}: its norm {kind} is not an RMSNorm the export reads.")
