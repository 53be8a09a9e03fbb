"""The query / key norms of the rotary attention layers (Qwen3, OLMo 2, Gemma 3, Llama 4, ...).

Many decoders normalize the projected queries and keys of each layer before (most) or after
(Llama 4, Hunyuan) RoPE: an RMSNorm over each head's channels with a learned scale shared by
the heads, Gemma's `(1 + scale)` form of it, one over all the heads' channels together
(OLMo 2's, before the heads are split), or one without a scale. Each kind here is named
after what it computes; `QUERY_KEY_NORMS` says which families use it.
"""

from __future__ import annotations

import dataclasses

import keras
from keras import ops


@dataclasses.dataclass(frozen=True)
class _Kind:
    across_heads: bool  # the mean over all heads' channels (the projection before the split)
    scale: str | None  # "scale": `* scale` (init 1); "one_plus": `* (1 + scale)` (init 0)
    after_rope: bool  # normalize the rotated queries and keys instead of the projected ones


# Each kind, with the transformers families whose attention computes it.
QUERY_KEY_NORMS = {
    # Qwen3 (and its MoE / VL), EXAONE 4, Apertus, LFM2, GLM-4-MoE (use_qk_norm), Gemma 4's q/k.
    "rms_per_head": _Kind(across_heads=False, scale="scale", after_rope=False),
    # Gemma 3, Qwen3-Next, Qwen3.5: `x / rms(x) * (1 + scale)`, scale initialized to 0.
    "gemma_rms_per_head": _Kind(across_heads=False, scale="one_plus", after_rope=False),
    # OLMo 2, OLMo 3, MiniMax-M2: one RMS over all the heads' channels, a scale per channel.
    "rms_across_heads": _Kind(across_heads=True, scale="scale", after_rope=False),
    # Hunyuan (dense and MoE): the per-head RMSNorm on the rotated queries and keys.
    "rms_per_head_after_rope": _Kind(across_heads=False, scale="scale", after_rope=True),
    # Llama 4's RoPE layers (use_qk_norm): an RMS norm without scale (its `L2Norm`), after RoPE.
    "l2_after_rope": _Kind(across_heads=False, scale=None, after_rope=True),
}


def checked_query_key_norm(kind, epsilon) -> tuple[str | None, float]:
    """`(kind, epsilon)` checked: a kind of `QUERY_KEY_NORMS` or None, a positive epsilon."""
    if kind is not None and kind not in QUERY_KEY_NORMS:
        raise ValueError(
            f"query_key_norm={kind!r} is not a query/key norm these layers have; give one of "
            f"{sorted(QUERY_KEY_NORMS)}, or None for none."
        )
    if isinstance(epsilon, bool) or not isinstance(epsilon, (int, float)) or not epsilon > 0:
        raise ValueError(
            f"query_key_norm_epsilon={epsilon!r}: it must be a positive number (the epsilon "
            "added to the mean square, e.g. the config's rms_norm_eps)."
        )
    return kind, float(epsilon)


def is_after_rope(kind: str | None) -> bool:
    return kind is not None and QUERY_KEY_NORMS[kind].after_rope


@keras.saving.register_keras_serializable(package="keras_posenc")
class QueryKeyNorm(keras.layers.Layer):
    """The norm of one attention's queries or keys, `(batch, sequence, heads, head_dim)`.

    `x * rsqrt(mean(x²) + epsilon) * scale` (or `* (1 + scale)`, or no scale), the mean over
    each head's channels or over all of them, computed in float32 as transformers does.

    Args:
        kind: a key of `QUERY_KEY_NORMS`.
        epsilon: added to the mean square.
        **kwargs: base `keras.layers.Layer` arguments.
    """

    def __init__(self, kind: str, epsilon: float = 1e-6, **kwargs):
        super().__init__(**kwargs)
        self.kind, self.epsilon = checked_query_key_norm(kind, epsilon)
        self.scale = None

    def build(self, input_shape) -> None:
        kind = QUERY_KEY_NORMS[self.kind]
        if len(input_shape) != 4 or None in input_shape[-2:]:
            raise ValueError(
                f"QueryKeyNorm takes (batch, sequence, heads, head_dim) heads of known size, "
                f"got shape {tuple(input_shape)}."
            )
        if kind.scale is not None:
            shape = tuple(input_shape[-2:]) if kind.across_heads else (input_shape[-1],)
            self.scale = self.add_weight(
                name="scale",
                shape=shape,
                initializer="ones" if kind.scale == "scale" else "zeros",
            )

    def call(self, inputs):
        kind = QUERY_KEY_NORMS[self.kind]
        x = ops.cast(inputs, "float32")
        axes = (-2, -1) if kind.across_heads else -1
        mean_square = ops.mean(ops.square(x), axis=axes, keepdims=True)
        x = x * ops.rsqrt(mean_square + self.epsilon)
        if kind.scale is not None:
            scale = ops.cast(self.scale, "float32")
            x = x * (1.0 + scale if kind.scale == "one_plus" else scale)
        return ops.cast(x, inputs.dtype)

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self) -> dict:
        return {**super().get_config(), "kind": self.kind, "epsilon": self.epsilon}
