"""`RotaryGroupQueryAttention`: grouped-query attention with RoPE on projected queries and keys."""

from __future__ import annotations

import keras
import numpy as np

from keras_posenc.backend import keras_private as private
from keras_posenc.layers.attention_temperature import AttentionTemperature
from keras_posenc.layers.rope_options import ROPE_DEFAULTS, renamed_rope_options
from keras_posenc.layers.rotary_attention_call import RotaryAttention


@keras.saving.register_keras_serializable(package="keras_posenc")
class RotaryGroupQueryAttention(RotaryAttention, keras.layers.GroupQueryAttention):
    """`keras.layers.GroupQueryAttention` whose projected queries and keys are rotated (RoPE).

    The attention of Llama 3, Qwen, Mistral: `num_query_heads` query heads share
    `num_key_value_heads` key/value heads (`num_key_value_heads == num_query_heads` is
    multi-head attention, 1 is multi-query attention). Keys are rotated (and cached)
    before they are repeated for the query groups. Same weights as `GroupQueryAttention`.

    Example:

    >>> attention = RotaryGroupQueryAttention(
    ...     head_dim=16, num_query_heads=4, num_key_value_heads=2, rope_max_wavelength=500000.0
    ... )
    >>> x = np.random.normal(size=(2, 10, 64)).astype("float32")
    >>> tuple(attention(x, x, use_causal_mask=True).shape)
    (2, 10, 64)
    >>> cache = np.zeros((2, 2, 32, 2, 16), "float32")  # (batch, 2, max_length, kv heads, head_dim)
    >>> output, cache = attention(x, x, use_causal_mask=True, cache=cache, cache_update_index=0)
    >>> token = x[:, :1]
    >>> output, cache = attention(token, token, cache=cache, cache_update_index=10)
    >>> tuple(output.shape), tuple(cache.shape)
    ((2, 1, 64), (2, 2, 32, 2, 16))

    Args:
        head_dim: size of each attention head.
        num_query_heads: number of query heads.
        num_key_value_heads: number of key/value heads; divides `num_query_heads`.
        rope_max_wavelength: the RoPE base (`RotaryEmbedding`'s `max_wavelength`).
        rope_layout: `"half"` or `"interleaved"` channel pairing (see `RotaryEmbedding`).
        rope_dim: rotate only the first `rope_dim` channels of each head; 0 rotates
            none (a NoPE layer: Llama 4, SmolLM3), with the other `rope_*` options left out.
        rope_scaling: RoPE scaling dict (see `RotaryEmbedding`'s `scaling`).
        rope_axes_dims: axial RoPE (see `RotaryEmbedding`'s `axes_dims`): the rotated
            channels of each axis; positions are then required, one coordinate per axis.
        rope_mrope_section: multimodal RoPE (see `RotaryEmbedding`'s `mrope_section`):
            the channel pairs of each axis `(time, height, width)`.
        rope_mrope_interleaved: with `rope_mrope_section`, pairs take their axes
            interleaved (Qwen3-VL) instead of in chunks (Qwen2-VL).
        positions_from_mask: derive query / key positions from their padding masks
            (`cumsum(mask) - 1`), so left-padded batches attend as if unpadded; with a
            cache, from `cache_mask`.
        query_temperature: Llama 4's attention temperature (its NoPE layers): an
            `AttentionTemperature` (`keras_posenc.attention_temperature(config)`) or its
            settings `{"floor_scale": ..., "attn_scale": ...}`. The rotated queries are
            multiplied by it at each query's index in the sequence (`cache_update_index +
            i` with a cache, `query_start_index + i` without); positions and padding do
            not move it, as in Llama 4.
        attention_chunk_size: Llama 4's chunked attention (its RoPE layers): a query
            attends only to keys of its own chunk of this many tokens (indices `// size`
            equal; with a cache, the slots), on top of the other masks. Chunks start at a
            row's first real token: after the left padding of `cache_mask` (with a cache)
            or of `query_mask` / `value_mask` (without), as transformers counts them.
        query_key_norm: normalize each layer's projected queries and keys (Qwen3, OLMo 2,
            Gemma 3, EXAONE 4, Llama 4, ...): None (none), or one of
            `keras_posenc.layers.query_key_norm.QUERY_KEY_NORMS`: `"rms_per_head"` (an RMSNorm
            over each head's channels, one scale shared by the heads), `"gemma_rms_per_head"`
            (the same times `1 + scale`), `"rms_across_heads"` (one RMSNorm over all the
            heads' channels, a scale per channel, as OLMo 2), all before RoPE;
            `"rms_per_head_after_rope"` (Hunyuan) and `"l2_after_rope"` (no scale; Llama 4)
            after it. The queries and keys get separate scales (the `query_norm` and
            `key_norm` sublayers, made in `build`).
        query_key_norm_epsilon: the norms' epsilon (a config's `rms_norm_eps`).
        **kwargs: the other `keras.layers.GroupQueryAttention` arguments. The names before
            the `rope_` prefix (`max_wavelength`, `rotary_layout`, `rotary_dim`,
            `rotary_scaling`) are still accepted.

    Call arguments:
        query, value, key, query_mask, value_mask, key_mask, attention_mask,
        return_attention_scores, training, use_causal_mask: as in `GroupQueryAttention`.
        query_positions, key_positions, query_start_index, key_start_index, cache,
        cache_update_index, cache_mask: as in `RotaryMultiHeadAttention`, with a cache of
            shape `(batch, 2, max_length, num_key_value_heads, head_dim)`.

    Output shape: `(batch, query_sequence, features)`, as `GroupQueryAttention`; with a
    cache, `(output, updated_cache)`.
    """

    def __init__(
        self,
        head_dim: int,
        num_query_heads: int,
        num_key_value_heads: int,
        rope_max_wavelength: float = ROPE_DEFAULTS["rope_max_wavelength"],
        rope_layout: str = ROPE_DEFAULTS["rope_layout"],
        rope_dim: int | None = ROPE_DEFAULTS["rope_dim"],
        rope_scaling: dict | None = ROPE_DEFAULTS["rope_scaling"],
        rope_axes_dims: tuple[int, ...] | None = ROPE_DEFAULTS["rope_axes_dims"],
        rope_mrope_section: tuple[int, ...] | None = ROPE_DEFAULTS["rope_mrope_section"],
        rope_mrope_interleaved: bool = ROPE_DEFAULTS["rope_mrope_interleaved"],
        positions_from_mask: bool = False,
        query_key_norm: str | None = None,
        query_key_norm_epsilon: float = 1e-6,
        query_temperature: dict | AttentionTemperature | None = None,
        attention_chunk_size: int | None = None,
        **kwargs,
    ):
        options = renamed_rope_options(
            {
                "rope_max_wavelength": rope_max_wavelength,
                "rope_layout": rope_layout,
                "rope_dim": rope_dim,
                "rope_scaling": rope_scaling,
                "rope_axes_dims": rope_axes_dims,
                "rope_mrope_section": rope_mrope_section,
                "rope_mrope_interleaved": rope_mrope_interleaved,
            },
            kwargs,
        )
        for name, value in (
            ("head_dim", head_dim),
            ("num_query_heads", num_query_heads),
            ("num_key_value_heads", num_key_value_heads),
        ):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                raise ValueError(f"{name}={value!r}: it must be a positive integer.")
        if attention_chunk_size is not None and (
            isinstance(attention_chunk_size, bool)
            or not isinstance(attention_chunk_size, (int, np.integer))
            or attention_chunk_size < 1
        ):
            raise ValueError(
                f"attention_chunk_size={attention_chunk_size!r}: it must be a positive "
                "integer (the tokens per chunk), or None."
            )
        super().__init__(head_dim, num_query_heads, num_key_value_heads, **kwargs)
        self._init_rotary(options, positions_from_mask)
        self._init_query_key_norm(query_key_norm, query_key_norm_epsilon)
        if attention_chunk_size is not None:
            self.attention_chunk_size = int(attention_chunk_size)
        if isinstance(query_temperature, dict):
            query_temperature = AttentionTemperature(**query_temperature)
        if not isinstance(query_temperature, (AttentionTemperature, type(None))):
            raise TypeError(
                "query_temperature must be an AttentionTemperature (keras_posenc."
                "attention_temperature(config)), its settings as a dict ({'floor_scale': "
                f"8192, 'attn_scale': 0.1}}), or None; got {query_temperature!r}."
            )
        self.query_temperature = query_temperature

    def get_config(self) -> dict:
        temperature = self.query_temperature
        return {
            **super().get_config(),
            "query_temperature": None
            if temperature is None
            else {"floor_scale": temperature.floor_scale, "attn_scale": temperature.attn_scale},
            "attention_chunk_size": self.attention_chunk_size,
        }

    def _head_counts(self) -> tuple[int, int, int, int]:
        return self.num_query_heads, self.num_key_value_heads, self.head_dim, self.head_dim

    def _scale(self) -> float:
        return private.attention_part(self, "inverse_sqrt_head_dim")

    # `sliding_window` (Keras 3.15) and `use_gate` (3.14) are absent from older Keras.
    def _window(self) -> int | None:
        return getattr(self, "sliding_window", None)

    def _uses_gate(self) -> bool:
        return getattr(self, "use_gate", False)
