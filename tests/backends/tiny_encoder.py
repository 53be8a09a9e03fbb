"""A tiny RoPE encoder for the distribution and train-on-JAX tests, in plain Keras.

Token embedding, the sinusoidal and learned position layers, one self-attention block
that rotates its queries and keys with `RotaryEmbedding`, mean pooling and a classifier.
The attention is written here with `keras.layers.EinsumDense` and `keras.ops` (the
package's attention layers need TensorFlow for now), so the same model runs on JAX and
loads from a `.keras` file under TensorFlow (importing this module registers the layer).

The task: the label is the position of the first token `MARKER`, so the position layers
matter to the loss.
"""

from __future__ import annotations

import keras
import numpy as np

import keras_posenc as kp

VOCABULARY = 24
MARKER = VOCABULARY - 1
LENGTH = 16
WIDTH = 16
HEADS = 4
HEAD_WIDTH = 4
MAX_LENGTH = 32  # the learned table: longer than training, so exports serve longer runs


@keras.saving.register_keras_serializable(package="posenc_tests")
class RotarySelfAttention(keras.layers.Layer):
    """Bidirectional multi-head self-attention with RoPE on the queries and keys.

    Args:
        heads: number of attention heads.
        head_width: width of each head (even, for the rotation).
        **kwargs: passed to `keras.layers.Layer`.
    """

    def __init__(self, heads: int, head_width: int, **kwargs):
        super().__init__(**kwargs)
        self.heads = heads
        self.head_width = head_width

    def build(self, input_shape) -> None:
        width = input_shape[-1]
        shape = (None, self.heads, self.head_width)
        # Kernels (width, heads, head_width): what a LayoutMap shards along the heads.
        self.query = keras.layers.EinsumDense("bsd,dhk->bshk", shape, bias_axes="hk", name="query")
        self.key = keras.layers.EinsumDense("bsd,dhk->bshk", shape, bias_axes="hk", name="key")
        self.value = keras.layers.EinsumDense("bsd,dhk->bshk", shape, bias_axes="hk", name="value")
        self.out = keras.layers.EinsumDense(
            "bshk,hkd->bsd", (None, width), bias_axes="d", name="out"
        )
        self.rotary = kp.RotaryEmbedding(name="rotary")
        for layer in (self.query, self.key, self.value):
            layer.build(input_shape)
        self.out.build((*input_shape[:-1], self.heads, self.head_width))
        super().build(input_shape)

    def call(self, x):
        q = self.rotary(self.query(x))
        k = self.rotary(self.key(x))
        scores = keras.ops.einsum("bshk,bthk->bhst", q, k) / float(np.sqrt(self.head_width))
        weights = keras.ops.softmax(scores, axis=-1)
        return self.out(keras.ops.einsum("bhst,bthk->bshk", weights, self.value(x)))

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self) -> dict:
        return {**super().get_config(), "heads": self.heads, "head_width": self.head_width}


def build(sequence_length: int | None = None) -> keras.Model:
    """The encoder, for runs of `sequence_length` tokens (None: any up to `MAX_LENGTH`)."""
    tokens = keras.Input((sequence_length,), dtype="int32", name="tokens")
    x = keras.layers.Embedding(VOCABULARY, WIDTH, name="tokens_embedding")(tokens)
    x = kp.SinusoidalPositionalEncoding(name="sinusoidal")(x)
    x = kp.LearnedPositionalEmbedding(MAX_LENGTH, name="learned")(x)
    x = RotarySelfAttention(HEADS, HEAD_WIDTH, name="attention")(x)
    x = keras.layers.GlobalAveragePooling1D(name="pool")(x)
    logits = keras.layers.Dense(LENGTH, name="classifier")(x)
    return keras.Model(tokens, logits, name="tiny_rope_encoder")


def data(samples: int = 64, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Token runs with a marker at a random position, and that position as the label."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, MARKER, size=(samples, LENGTH)).astype("int32")
    tokens[np.arange(samples), rng.integers(0, LENGTH, samples)] = MARKER
    return tokens, np.argmax(tokens == MARKER, axis=1).astype("int32")


def compile_for_training(model: keras.Model) -> None:
    """SGD, not Adam: Adam divides by sqrt(v), which turns rounding-level differences of
    near-zero gradients into update-sized ones."""
    model.compile(
        keras.optimizers.SGD(0.5),
        keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
