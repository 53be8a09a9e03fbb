"""Readers of the layers several families share: arrays, kernels, biases, RMSNorms."""

from __future__ import annotations

import keras
import numpy as np

from keras_posenc.export.decoder.description import Norm
from keras_posenc.export.decoder.keras_quantized import kernel_of
from keras_posenc.export.decoder.weight_arrays import weight_array
from keras_posenc.export.errors import ExportError

# Gemma's: `x / sqrt(mean(x²) + epsilon) * (1 + scale)`; `1 + scale` rounds to the same
# float32 as keras_hub's, so it is stored as the scale.
_GEMMA_NORM = "RMSNormalization"


def array(variable) -> np.ndarray:
    """`weight_arrays.weight_array`: the variable's float32 value, a view where it can be."""
    return weight_array(variable)


def dense_kernel(layer, owner: str) -> np.ndarray:
    """The kernel of a Dense without a bias or an activation (either is refused)."""
    if layer.bias is not None or layer.activation is not keras.activations.linear:
        raise ExportError(f"{owner}: its Dense {layer.name!r} has a bias or an activation.")
    return kernel_of(layer, owner)


def flat_bias(layer) -> np.ndarray | None:
    """The bias of an EinsumDense (or a Dense) flattened, or None without one."""
    bias = getattr(layer, "bias", None)
    return None if bias is None else array(bias).reshape(-1)


def rms_norm(layer, owner: str, scaled_classes: tuple[str, ...] = ()) -> Norm:
    """An RMSNorm: a class of `scaled_classes` (the family's own, `x * rsqrt(mean(x²) +
    epsilon) * scale` in float32), or a `RMSNormalization`: Keras's and Gemma 4's
    multiply by the scale, Gemma's (1 to 3) by `1 + scale`.

    Raises:
        ExportError: another layer, or a Keras RMSNormalization not over the last axis.
    """
    kind, module = type(layer).__name__, type(layer).__module__
    # Gemma 4's and Keras's own (SmolLM3's) RMSNormalization multiply by the scale itself.
    plain = module.startswith(("keras_hub.src.models.gemma4.", "keras.src.layers."))
    if kind in scaled_classes or (kind == _GEMMA_NORM and plain):
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
