"""The model of `fixtures/saved_by_main_2026_12_07.keras`: each serializable layer of ours.

The `.keras` file was written by this module's `main()` on the main of 2026-12-07, before the
package's modules moved into folders (issue #38); `tests/test_keras_file_fixture.py` loads it
with today's code. Run `python -m tests.saved_by_main` only to write a new fixture (a new name).
"""

from __future__ import annotations

import sys

import keras
import numpy as np

from keras_posenc import (
    AttentionTemperature,
    DecoderBlock,
    LearnedPositionalEmbedding,
    RotaryEmbedding,
    RotaryGroupQueryAttention,
    RotaryMultiHeadAttention,
    SinusoidalPositionalEncoding,
)

FEATURES, HEADS, HEAD_DIM = 16, 2, 8
LLAMA3 = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 16,
}


def build_model() -> keras.Model:
    """The fixture's model, each layer built from explicit constructor arguments."""
    inputs = keras.Input((None, FEATURES))
    positions = keras.Input((None,), dtype="int32")
    x = SinusoidalPositionalEncoding()(inputs)
    x = LearnedPositionalEmbedding(32, embeddings_initializer="sinusoidal")(x)
    x = RotaryMultiHeadAttention(num_heads=HEADS, key_dim=HEAD_DIM)(x, x, use_causal_mask=True)
    x = RotaryGroupQueryAttention(
        head_dim=HEAD_DIM,
        num_query_heads=HEADS,
        num_key_value_heads=1,
        rope_scaling=LLAMA3,
        query_key_norm="rms_per_head",
    )(x, x, use_causal_mask=True)
    x = DecoderBlock(
        head_dim=HEAD_DIM, num_query_heads=HEADS, num_key_value_heads=1, intermediate_dim=24
    )(x)
    temperature = AttentionTemperature(floor_scale=4, attn_scale=0.1)(positions)
    x = x * keras.ops.expand_dims(temperature, -1)
    x = keras.layers.Reshape((-1, HEADS, HEAD_DIM))(x)
    linear = {"rope_type": "linear", "factor": 2.0}
    outputs = RotaryEmbedding(layout="interleaved", scaling=linear)(x)
    return keras.Model([inputs, positions], outputs)


def inputs(batch: int = 2, length: int = 7) -> list[np.ndarray]:
    x = np.random.default_rng(0).normal(size=(batch, length, FEATURES)).astype("float32")
    return [x, np.tile(np.arange(length, dtype="int32"), (batch, 1))]


def main(path: str) -> None:
    keras.utils.set_random_seed(0)
    build_model().save(path)


if __name__ == "__main__":
    main(sys.argv[1])
