"""`RotaryMultiHeadAttention`: multi-head attention with RoPE on projected queries and keys."""

from __future__ import annotations

import keras

from keras_posenc.positions import positions_from_mask
from keras_posenc.rotary import RotaryEmbedding


@keras.saving.register_keras_serializable(package="keras_posenc")
class RotaryMultiHeadAttention(keras.layers.MultiHeadAttention):
    """`keras.layers.MultiHeadAttention` whose projected queries and keys are rotated (RoPE).

    Everything `MultiHeadAttention` takes works as there; the rotation happens between
    the projections and the dot product, so attention scores depend on the relative
    position of query and key only.

    Example:

    >>> attention = RotaryMultiHeadAttention(num_heads=4, key_dim=16)
    >>> x = np.random.normal(size=(2, 10, 64)).astype("float32")
    >>> tuple(attention(x, x, use_causal_mask=True).shape)
    (2, 10, 64)

    Args:
        num_heads: number of attention heads.
        key_dim: size of each head for query and key.
        max_wavelength: the RoPE base (see `RotaryEmbedding`).
        rotary_layout: `"half"` or `"interleaved"` channel pairing (see `RotaryEmbedding`).
        rotary_dim: rotate only the first `rotary_dim` channels of each head.
        rotary_scaling: RoPE scaling dict (see `RotaryEmbedding`'s `scaling`).
        positions_from_mask: derive query / key positions from their padding masks
            (`cumsum(mask) - 1`), so left-padded batches attend as if unpadded.
        **kwargs: the other `keras.layers.MultiHeadAttention` arguments.

    Call arguments:
        query, value, key, query_mask, value_mask, key_mask, attention_mask,
        return_attention_scores, training, use_causal_mask: as in `MultiHeadAttention`.
        query_positions, key_positions: optional integer positions, `(sequence,)` or
            `(batch, sequence)`, of the query and of the key/value steps.
        query_start_index, key_start_index: the position of the first query / key step
            when the positions are not given (int or scalar int tensor). To decode one
            token at step `t` against the states of steps `0..t`, pass the token as `query`
            with `query_start_index=t` and the states as `value`.

    Output shape: `(batch, query_sequence, output_dim)`, as `MultiHeadAttention`.
    """

    def __init__(
        self,
        num_heads: int,
        key_dim: int,
        max_wavelength: float = 10000.0,
        rotary_layout: str = "half",
        rotary_dim: int | None = None,
        rotary_scaling: dict | None = None,
        positions_from_mask: bool = False,
        **kwargs,
    ):
        attention_axes = kwargs.get("attention_axes")
        if attention_axes not in (None, 1, (1,), [1]):
            raise ValueError(
                "RotaryMultiHeadAttention rotates along the sequence axis 1 and attends over "
                f"it; attention_axes={attention_axes!r} is not supported (leave it None)."
            )
        super().__init__(num_heads, key_dim, **kwargs)
        self.rotary_embedding = RotaryEmbedding(
            max_wavelength=max_wavelength,
            layout=rotary_layout,
            rotary_dim=rotary_dim,
            scaling=rotary_scaling,
            sequence_axis=1,
            feature_axis=-1,
            dtype=self.dtype_policy,
            name="rotary_embedding",
        )
        self.positions_from_mask = bool(positions_from_mask)
        self._rotation = None

    def build(self, query_shape, value_shape, key_shape=None) -> None:
        super().build(query_shape, value_shape, key_shape)
        # Queries and keys share key_dim per head: one rotation serves both.
        self.rotary_embedding.build((None, None, self.num_heads, self.key_dim))

    def call(
        self,
        query,
        value,
        key=None,
        query_mask=None,
        value_mask=None,
        key_mask=None,
        attention_mask=None,
        return_attention_scores=False,
        training=None,
        use_causal_mask=False,
        query_positions=None,
        key_positions=None,
        query_start_index=0,
        key_start_index=0,
    ):
        if self.positions_from_mask:
            key_source = value if key is None else key
            query_mask = _mask_of(query, query_mask)
            key_mask_or_value_mask = _mask_of(
                key_source, key_mask if key is not None else value_mask
            )
            if query_positions is None and query_mask is not None:
                query_positions = positions_from_mask(query_mask, query_start_index)
                query_start_index = 0
            if key_positions is None and key_mask_or_value_mask is not None:
                key_positions = positions_from_mask(key_mask_or_value_mask, key_start_index)
                key_start_index = 0
        # The parent's call projects and then calls `_compute_attention`, which rotates:
        # hand the positions over for the length of this call.
        self._rotation = (query_positions, query_start_index, key_positions, key_start_index)
        try:
            return super().call(
                query,
                value,
                key=key,
                query_mask=query_mask,
                value_mask=value_mask,
                key_mask=key_mask,
                attention_mask=attention_mask,
                return_attention_scores=return_attention_scores,
                training=training,
                use_causal_mask=use_causal_mask,
            )
        finally:
            self._rotation = None

    def compute_output_spec(
        self,
        query,
        value,
        key=None,
        *args,
        query_positions=None,
        key_positions=None,
        query_start_index=0,
        key_start_index=0,
        **kwargs,
    ):
        # Positions change values, not shapes (and the parent does not know them).
        return super().compute_output_spec(query, value, key, *args, **kwargs)

    def _compute_attention(self, query, key, value, *args, **kwargs):
        query_positions, query_start_index, key_positions, key_start_index = self._rotation
        query = self.rotary_embedding(
            query, positions=query_positions, start_index=query_start_index
        )
        key = self.rotary_embedding(key, positions=key_positions, start_index=key_start_index)
        return super()._compute_attention(query, key, value, *args, **kwargs)

    def get_config(self) -> dict:
        config = super().get_config()
        config.update(
            {
                "max_wavelength": self.rotary_embedding.max_wavelength,
                "rotary_layout": self.rotary_embedding.layout,
                "rotary_dim": self.rotary_embedding.rotary_dim,
                "rotary_scaling": self.rotary_embedding.scaling,
                "positions_from_mask": self.positions_from_mask,
            }
        )
        return config


def _mask_of(tensor, given):
    return given if given is not None else getattr(tensor, "_keras_mask", None)
