"""The default encoders `python -m export` builds: small seeded Transformer encoders.

One per kind of position information: `sinusoidal` and `learned` add it to the token
embeddings, `rotary` rotates queries and keys inside every attention layer
(`RotaryMultiHeadAttention`). Weights come from a seeded numpy generator, so every run
builds the same model.
"""

from __future__ import annotations

import dataclasses

import keras
import numpy as np

from keras_posenc import (
    LearnedPositionalEmbedding,
    RotaryMultiHeadAttention,
    SinusoidalPositionalEncoding,
)
from keras_posenc.export import causal_mask

POSITION_KINDS = ("sinusoidal", "learned", "rotary")


@dataclasses.dataclass(frozen=True)
class EncoderSpec:
    """What a default encoder is made of.

    Args:
        name: the encoder's name (its artifacts folder).
        position: `"sinusoidal"`, `"learned"` or `"rotary"`.
        vocabulary_size: token ids are below this.
        width: the model width.
        num_heads: attention heads per block.
        num_blocks: Transformer blocks.
        feed_forward_dim: hidden width of each block's feed-forward network.
        max_sequence_length: the longest sequence the encoder allows: the learned table's
            length; None (sinusoidal, rotary) for no limit, and then verification runs up
            to `coverage.REACHING_LENGTHS` steps: every cached row and a few split ones.
        seed: seed of the weights.
    """

    name: str
    position: str
    vocabulary_size: int = 1000
    width: int = 64
    num_heads: int = 4
    num_blocks: int = 2
    feed_forward_dim: int = 128
    max_sequence_length: int | None = None
    seed: int = 0


DEFAULT_ENCODERS = {
    "sinusoidal": EncoderSpec("sinusoidal", "sinusoidal", seed=1),
    "learned": EncoderSpec("learned", "learned", max_sequence_length=512, seed=2),
    "rotary": EncoderSpec("rotary", "rotary", seed=3),
}


@keras.saving.register_keras_serializable(package="keras_posenc_export")
class EncoderBlock(keras.layers.Layer):
    """A pre-norm Transformer block: attention and a feed-forward network, each residual.

    With `rotary=True` the attention is `RotaryMultiHeadAttention` and the block's
    `start_index` is the position of its first step.

    Args:
        num_heads: attention heads.
        feed_forward_dim: hidden width of the feed-forward network.
        rotary: rotate queries and keys (RoPE) inside the attention.
        causal: each step attends to itself and earlier steps only (an explicit
            `causal_mask`, which converts to LiteRT with built-in ops).
        **kwargs: base layer arguments.

    Call arguments:
        inputs: `(batch, sequence, width)`.
        start_index: position of the first step (int or scalar int tensor); used by the
            rotary attention only.
    """

    def __init__(
        self,
        num_heads: int,
        feed_forward_dim: int,
        rotary: bool = False,
        causal: bool = False,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.num_heads = num_heads
        self.feed_forward_dim = feed_forward_dim
        self.rotary = rotary
        self.causal = causal

    def build(self, input_shape) -> None:
        width = input_shape[-1]
        attention = RotaryMultiHeadAttention if self.rotary else keras.layers.MultiHeadAttention
        self.attention = attention(
            self.num_heads, width // self.num_heads, dtype=self.dtype_policy, name="attention"
        )
        self.attention.build(input_shape, input_shape)
        self.attention_norm = keras.layers.LayerNormalization(
            epsilon=1e-5, dtype=self.dtype_policy, name="attention_norm"
        )
        self.attention_norm.build(input_shape)
        self.feed_forward_norm = keras.layers.LayerNormalization(
            epsilon=1e-5, dtype=self.dtype_policy, name="feed_forward_norm"
        )
        self.feed_forward_norm.build(input_shape)
        self.hidden = keras.layers.Dense(
            self.feed_forward_dim, activation="silu", dtype=self.dtype_policy, name="hidden"
        )
        self.hidden.build(input_shape)
        self.projection = keras.layers.Dense(width, dtype=self.dtype_policy, name="projection")
        self.projection.build((*input_shape[:-1], self.feed_forward_dim))
        super().build(input_shape)

    def call(self, inputs, start_index=0):
        normed = self.attention_norm(inputs)
        rotary_arguments = (
            {"query_start_index": start_index, "key_start_index": start_index}
            if self.rotary
            else {}
        )
        if self.causal:
            rotary_arguments["attention_mask"] = causal_mask(normed)
        attended = self.attention(normed, normed, **rotary_arguments)
        hidden = inputs + attended
        return hidden + self.projection(self.hidden(self.feed_forward_norm(hidden)))

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self) -> dict:
        config = super().get_config()
        config.update(
            {
                "num_heads": self.num_heads,
                "feed_forward_dim": self.feed_forward_dim,
                "rotary": self.rotary,
                "causal": self.causal,
            }
        )
        return config


def build_encoder(spec: EncoderSpec, decoding: bool = False, dtype=None) -> keras.Model:
    """A Transformer encoder from `spec`: token ids in, `{"encoded": (batch, sequence, width)}` out.

    Args:
        spec: the encoder's sizes and position kind.
        decoding: add a scalar `start_index` input (the position of the first token, as when
            decoding with a cache) and make attention causal.
        dtype: a dtype policy for every layer (default: Keras's global policy).

    Returns:
        A functional model with seeded weights.
    """
    if spec.position not in POSITION_KINDS:
        raise ValueError(
            f"Unknown position kind {spec.position!r}; expected one of {POSITION_KINDS}."
        )
    if spec.position == "learned" and not spec.max_sequence_length:
        raise ValueError(
            "A learned encoder needs max_sequence_length, the length of its table; "
            f"got {spec.max_sequence_length!r}."
        )
    token_ids = keras.Input(shape=(None,), dtype="int32", name="token_ids")
    inputs = {"token_ids": token_ids}
    start_index = 0
    if decoding:
        start_index = inputs["start_index"] = keras.Input(
            batch_shape=(), dtype="int32", name="start_index"
        )
    hidden = keras.layers.Embedding(
        spec.vocabulary_size, spec.width, dtype=dtype, name="token_embedding"
    )(token_ids)
    if spec.position == "sinusoidal":
        hidden = SinusoidalPositionalEncoding(dtype=dtype, name="positions")(
            hidden, start_index=start_index
        )
    elif spec.position == "learned":
        hidden = LearnedPositionalEmbedding(
            spec.max_sequence_length, dtype=dtype, name="positions"
        )(hidden, start_index=start_index)
    for index in range(spec.num_blocks):
        hidden = EncoderBlock(
            spec.num_heads,
            spec.feed_forward_dim,
            rotary=spec.position == "rotary",
            causal=decoding,
            dtype=dtype,
            name=f"block_{index}",
        )(hidden, start_index=start_index)
    encoded = keras.layers.LayerNormalization(epsilon=1e-5, dtype=dtype, name="final_norm")(hidden)
    model = keras.Model(inputs, {"encoded": encoded}, name=f"{spec.name}_encoder")
    seed_weights(model, spec.seed)
    return model


def seed_weights(model: keras.Model, seed: int) -> None:
    """Sets every weight from a numpy generator seeded with `seed`.

    Matrices get `N(0, 1/fan_in)` (fan-in: all axes but the last), normalization scales
    `1 + N(0, 0.1²)`, biases and offsets `N(0, 0.1²)`: the same numbers on every machine
    and Keras version, and no weight left at exactly 0 or 1.
    """
    rng = np.random.default_rng(seed)
    for variable in model.weights:
        shape = tuple(variable.shape)
        if len(shape) >= 2:
            fan_in = int(np.prod(shape[:-1]))
            value = rng.standard_normal(shape) / np.sqrt(fan_in)
        elif variable.name == "gamma":
            value = 1.0 + 0.1 * rng.standard_normal(shape)
        else:
            value = 0.1 * rng.standard_normal(shape)
        variable.assign(value.astype(keras.backend.standardize_dtype(variable.dtype)))
