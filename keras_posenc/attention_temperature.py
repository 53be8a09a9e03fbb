"""Llama 4's attention temperature: a position-dependent scale of the queries of NoPE layers.

Llama 4 (transformers' `Llama4TextAttention`, after Nakanishi 2025, arXiv:2501.19399)
multiplies the queries of its NoPE layers by `log1p(floor((p + 1) / floor_scale)) *
attn_scale + 1` at position `p`, so that attention stays sharp far into a long context.
"""

from __future__ import annotations

from typing import Any

import keras
import numpy as np
from keras import ops

from keras_posenc._checks import short_repr
from keras_posenc.configs.language_model import as_dict, language_config


@keras.saving.register_keras_serializable(package="keras_posenc")
class AttentionTemperature(keras.layers.Layer):
    """Llama 4's query scale `log1p(floor((p + 1) / floor_scale)) * attn_scale + 1`.

    Multiply the queries of a NoPE layer by it (`queries * scale[..., None, None]` for
    queries of shape `(batch, sequence, heads, head_dim)`), before the dot product with
    the keys. Llama 4 takes `p` as the token's index in the sequence, cache included
    (`start_index + arange(sequence)`), not its position id: left padding does not move it.
    The floor is an integer division, exact at every position; the result is float32.

    Example:

    >>> temperature = AttentionTemperature(floor_scale=8192, attn_scale=0.1)
    >>> [round(float(s), 6) for s in temperature(np.array([0, 8190, 8191, 20000]))]
    [1.0, 1.0, 1.069315, 1.109861]

    Args:
        floor_scale: positions per step of the scale (Llama 4: 8192).
        attn_scale: the scale's growth per `log1p` step (Llama 4: 0.1).

    Call arguments:
        positions: integer positions, any shape.

    Returns:
        float32 scales of the shape of `positions`.
    """

    def __init__(self, floor_scale: int = 8192, attn_scale: float = 0.1, **kwargs):
        super().__init__(**kwargs)
        if isinstance(floor_scale, float) and floor_scale.is_integer():
            floor_scale = int(floor_scale)
        if isinstance(floor_scale, bool) or not isinstance(floor_scale, int) or floor_scale <= 0:
            raise ValueError(
                f"floor_scale must be a positive integer, got {short_repr(floor_scale)}."
            )
        if isinstance(attn_scale, bool) or not isinstance(attn_scale, (int, float)):
            raise ValueError(f"attn_scale must be a number, got {short_repr(attn_scale)}.")
        self.floor_scale = floor_scale
        self.attn_scale = float(attn_scale)

    def call(self, positions):
        positions = ops.convert_to_tensor(positions)
        dtype = keras.backend.standardize_dtype(positions.dtype)
        if "int" not in dtype:
            raise TypeError(f"positions must be integers, got {dtype}.")
        # int64 where the backend has it (JAX without x64: int32, positions below 2^31 - 1
        # as the attention's int32 indices are anyway).
        wide = _widest_int()
        steps = ops.floor_divide(ops.cast(positions, wide) + 1, np.asarray(self.floor_scale, wide))
        # log(1 + n), not log1p: tf2onnx has no Log1p, and 1 + n is exact for an integer n.
        return ops.log(ops.cast(steps, "float32") + 1.0) * self.attn_scale + 1.0

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self) -> dict:
        return {
            **super().get_config(),
            "floor_scale": self.floor_scale,
            "attn_scale": self.attn_scale,
        }


def attention_temperature(config: Any) -> AttentionTemperature | None:
    """The `AttentionTemperature` of a Llama 4 config, or None where it has none.

    Args:
        config: a transformers config or its dict; a `llama4` config is read through its
            `text_config`.

    Returns:
        The layer for `floor_scale` / `attn_scale` (defaults 8192 / 0.1) when the config's
        `attn_temperature_tuning` is on (its default), else None. It applies to the NoPE
        layers only: those `keras_posenc.rope_per_layer` gives as None.

    Example:

    >>> attention_temperature({"model_type": "llama4_text", "floor_scale": 4096}).floor_scale
    4096
    """
    text = language_config(as_dict(config))
    if text.get("model_type") != "llama4_text":
        raise ValueError(
            f"model_type {short_repr(text.get('model_type'))} has no attention temperature "
            "(Llama 4's, 'llama4' / 'llama4_text', is the one this reads)."
        )
    if not text.get("attn_temperature_tuning", True):
        return None
    return AttentionTemperature(
        floor_scale=text.get("floor_scale", 8192), attn_scale=text.get("attn_scale", 0.1)
    )


def _widest_int() -> str:
    """int64, but int32 on JAX without x64 (which truncates int64 to it, with a warning)."""
    if keras.backend.backend() == "jax":
        import jax

        return "int64" if jax.config.jax_enable_x64 else "int32"
    return "int64"
