"""`RotaryMultiHeadAttention`: multi-head attention with RoPE on projected queries and keys."""

from __future__ import annotations

import keras

from keras_posenc.backend import keras_private as private
from keras_posenc.layers.rope_options import ROPE_DEFAULTS, renamed_rope_options
from keras_posenc.layers.rotary_attention_call import RotaryAttention


@keras.saving.register_keras_serializable(package="keras_posenc")
class RotaryMultiHeadAttention(RotaryAttention, keras.layers.MultiHeadAttention):
    """`keras.layers.MultiHeadAttention` whose projected queries and keys are rotated (RoPE).

    Everything `MultiHeadAttention` takes works as there, with the same weights; the
    rotation happens between the projections and the dot product, so attention scores
    depend on the relative position of query and key only. With a `cache` (the shape of
    keras_hub's `CachedMultiHeadAttention`) it decodes one token, or prefills many, per call.

    Example:

    >>> attention = RotaryMultiHeadAttention(num_heads=4, key_dim=16)
    >>> x = np.random.normal(size=(2, 10, 64)).astype("float32")
    >>> tuple(attention(x, x, use_causal_mask=True).shape)
    (2, 10, 64)
    >>> cache = np.zeros((2, 2, 32, 4, 16), "float32")  # (batch, 2, max_length, heads, key_dim)
    >>> output, cache = attention(x, x, use_causal_mask=True, cache=cache, cache_update_index=0)
    >>> token = x[:, :1]
    >>> output, cache = attention(token, token, cache=cache, cache_update_index=10)
    >>> tuple(output.shape), tuple(cache.shape)
    ((2, 1, 64), (2, 2, 32, 4, 16))

    Args:
        num_heads: number of attention heads.
        key_dim: size of each head for query and key.
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
        **kwargs: the other `keras.layers.MultiHeadAttention` arguments. The names before
            the `rope_` prefix (`max_wavelength`, `rotary_layout`, `rotary_dim`,
            `rotary_scaling`) are still accepted.

    Call arguments:
        query, value, key, query_mask, value_mask, key_mask, attention_mask,
        return_attention_scores, training, use_causal_mask: as in `MultiHeadAttention`.
        query_positions, key_positions: optional integer positions, `(sequence,)` or
            `(batch, sequence)`, of the query and of the key/value steps; with
            `rope_axes_dims` or `rope_mrope_section`, `(sequence, axes)` or `(batch,
            sequence, axes)`, one coordinate per axis (with a cache: of the new tokens).
        query_start_index, key_start_index: the position of the first query / key step
            when the positions are not given (int or scalar int tensor). They move RoPE
            only: without a cache `use_causal_mask` stays Keras's mask by index in the call
            (query `i` sees keys `j <= i`); give an `attention_mask` for another alignment,
            or decode with a cache.
        cache: optional `(batch, 2, max_length, num_heads, key_dim)` keys (rotated) and
            values of earlier steps. The new keys and values are written at
            `cache_update_index` and the call returns `(output, updated_cache)`; the
            queries attend over the filled slots `< cache_update_index + steps` (and,
            with `use_causal_mask`, the slots up to their own).
        cache_update_index: with a cache, the slot of the first new token (int or scalar
            int tensor). Positions default to `cache_update_index + range(steps)`.
        cache_mask: with a cache, optional `(batch, max_length)` padding of the slots
            (false for padding, never attended to); with `positions_from_mask`, a
            token's position is its row's count of real slots before it.

    Output shape: `(batch, query_sequence, output_dim)`, as `MultiHeadAttention`; with a
    cache, `(output, updated_cache)`.
    """

    _CONFIG_FORM = "mha"

    def __init__(
        self,
        num_heads: int,
        key_dim: int,
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
        attention_axes = kwargs.get("attention_axes")
        if attention_axes not in (None, 1, (1,), [1]):
            raise ValueError(
                "RotaryMultiHeadAttention rotates along the sequence axis 1 and attends over "
                f"it; attention_axes={attention_axes!r} is not supported (leave it None)."
            )
        super().__init__(num_heads, key_dim, **kwargs)
        self._init_rotary(options, positions_from_mask)
        self._init_query_key_norm(query_key_norm, query_key_norm_epsilon)

    def _head_counts(self) -> tuple[int, int, int, int]:
        return self.num_heads, self.num_heads, self.key_dim, self.value_dim

    def _scale(self) -> float:
        return private.attention_part(self, "inverse_sqrt_key_dim")

    def _window(self) -> int | None:
        return private.attention_part(self, "sliding_window")

    def _uses_gate(self) -> bool:
        return private.attention_part(self, "use_gate")
