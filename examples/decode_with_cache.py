"""Token-by-token decoding with `start_index` and a key/value cache, equal to the full pass.

A causal decoder sees the whole sequence at once in training; when it generates, it gets one
new token per step and must give that token the position it has in the sequence. The layers
take that position as `start_index` (a Python int or a scalar int tensor, so one traced step
serves every position):

1. rotary attention with a cache of the states: the new token is the query at
   `query_start_index=t`, the states of steps `0..t` are the value (keys at positions `0..t`);
2. rotary attention with a true key/value cache: project the new token once, rotate its query
   and key with `RotaryEmbedding(start_index=t)`, append key and value to the cache;
3. sinusoidal positions: `SinusoidalPositionalEncoding(start_index=t)` encodes the new token,
   and the encoded states are cached.

Each way's per-step outputs are compared with the full-sequence causal outputs.

Run it:

    python examples/decode_with_cache.py           # 64 steps
    python examples/decode_with_cache.py --tiny    # 8 steps (also KERAS_POSENC_EXAMPLE_TINY=1)
"""

from __future__ import annotations

import argparse
import math
import os

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from keras_posenc import RotaryMultiHeadAttention, SinusoidalPositionalEncoding  # noqa: E402

TINY_ENVIRONMENT_VARIABLE = "KERAS_POSENC_EXAMPLE_TINY"
VOCABULARY_SIZE = 100


class Decoder(keras.Model):
    """A one-block causal decoder: embedding, positions, self-attention, logits.

    Args:
        positions: `"rotary"` (RoPE inside the attention) or `"sinusoidal"` (added to the
            embeddings).
        width: the model width.
        num_heads: attention heads, each `width // num_heads` wide.
    """

    def __init__(self, positions: str, width: int = 32, num_heads: int = 4, **kwargs):
        super().__init__(**kwargs)
        if positions not in ("rotary", "sinusoidal"):
            raise ValueError(f"positions must be 'rotary' or 'sinusoidal', got {positions!r}.")
        self.positions = positions
        # Unit-scale embeddings give attention scores of order one, so a wrong position
        # would change the outputs visibly (Keras's default ±0.05 makes attention near uniform).
        self.embedding = keras.layers.Embedding(
            VOCABULARY_SIZE,
            width,
            embeddings_initializer=keras.initializers.RandomNormal(stddev=1.0),
        )
        key_dim = width // num_heads
        if positions == "rotary":
            self.attention = RotaryMultiHeadAttention(num_heads, key_dim)
        else:
            self.encoding = SinusoidalPositionalEncoding()
            self.attention = keras.layers.MultiHeadAttention(num_heads, key_dim)
        self.norm = keras.layers.LayerNormalization()
        self.logits = keras.layers.Dense(VOCABULARY_SIZE)

    def embed(self, tokens, start_index=0):
        """Token embeddings, plus the sinusoidal encoding of positions `start_index ..`."""
        states = self.embedding(tokens)
        if self.positions == "sinusoidal":
            states = self.encoding(states, start_index=start_index)
        return states

    def head(self, states, attended):
        return self.logits(self.norm(states + attended))

    def call(self, tokens):
        """Logits for every step of `tokens` `(batch, sequence)`, each step seeing only its past."""
        states = self.embed(tokens)
        return self.head(states, self.attention(states, states, use_causal_mask=True))


def decode_with_state_cache(decoder: Decoder, tokens: np.ndarray) -> np.ndarray:
    """Logits step by step, caching the (encoded) input states of the steps seen so far.

    At step `t` the new token is the only query, at position `t`; the cached states of steps
    `0..t` are keys and values at positions `0..t`. It attends to all of them, so it needs no
    mask. One traced `step` serves every `t`: the position is a tensor.
    """
    width = decoder.embedding.output_dim

    @tf.function(
        input_signature=[
            tf.TensorSpec((None, 1), tf.int32, name="token"),
            tf.TensorSpec((None, None, width), tf.float32, name="cached_states"),
            tf.TensorSpec((), tf.int32, name="step"),
        ]
    )
    def step(token, cached_states, t):
        state = decoder.embed(token, start_index=t)
        cached_states = tf.concat([cached_states, state], axis=1)
        if decoder.positions == "rotary":
            attended = decoder.attention(state, cached_states, query_start_index=t)
        else:
            attended = decoder.attention(state, cached_states)
        return decoder.head(state, attended), cached_states

    cached_states = tf.zeros((tokens.shape[0], 0, width))
    logits = []
    for t in range(tokens.shape[1]):
        step_logits, cached_states = step(tokens[:, t : t + 1], cached_states, tf.constant(t))
        logits.append(step_logits)
    if step.experimental_get_tracing_count() != 1:
        raise AssertionError("The step function should be traced once for every position.")
    return np.concatenate(logits, axis=1)


def decode_with_key_value_cache(decoder: Decoder, tokens: np.ndarray) -> np.ndarray:
    """Logits step by step with a cache of projected, rotated keys and projected values.

    Each token is projected once; its key is rotated to its position `t` with the
    attention layer's `RotaryEmbedding(start_index=t)` and stays in the cache as it is.
    """
    attention = decoder.attention
    heads, key_dim = attention.num_heads, attention.key_dim
    rotate = attention.rotary_embedding

    @tf.function(
        input_signature=[
            tf.TensorSpec((None, 1), tf.int32, name="token"),
            tf.TensorSpec((None, None, heads, key_dim), tf.float32, name="cached_keys"),
            tf.TensorSpec((None, None, heads, key_dim), tf.float32, name="cached_values"),
            tf.TensorSpec((), tf.int32, name="step"),
        ]
    )
    def step(token, cached_keys, cached_values, t):
        state = decoder.embed(token)
        query = rotate(attention.query_dense(state), start_index=t)
        cached_keys = tf.concat([cached_keys, rotate(attention.key_dense(state), start_index=t)], 1)
        cached_values = tf.concat([cached_values, attention.value_dense(state)], 1)
        scores = tf.einsum("bqhd,bkhd->bhqk", query, cached_keys) / math.sqrt(key_dim)
        weights = tf.nn.softmax(scores, axis=-1)
        attended = attention.output_dense(tf.einsum("bhqk,bkhd->bqhd", weights, cached_values))
        return decoder.head(state, attended), cached_keys, cached_values

    empty = tf.zeros((tokens.shape[0], 0, heads, key_dim))
    cached_keys, cached_values = empty, empty
    logits = []
    for t in range(tokens.shape[1]):
        step_logits, cached_keys, cached_values = step(
            tokens[:, t : t + 1], cached_keys, cached_values, tf.constant(t)
        )
        logits.append(step_logits)
    if step.experimental_get_tracing_count() != 1:
        raise AssertionError("The step function should be traced once for every position.")
    return np.concatenate(logits, axis=1)


def run(tiny: bool = False, seed: int = 0) -> dict[str, float]:
    """Decodes random tokens each way and returns the max abs difference from the full pass.

    Returns:
        `{way: max |step-by-step logits - full-sequence causal logits|}` for
        `"rotary, state cache"`, `"rotary, key/value cache"`, `"sinusoidal, state cache"`.
    """
    keras.utils.set_random_seed(seed)
    batch, steps = (2, 8) if tiny else (2, 64)
    tokens = np.random.default_rng(seed).integers(0, VOCABULARY_SIZE, (batch, steps), np.int32)
    rotary = Decoder("rotary")
    sinusoidal = Decoder("sinusoidal")
    ways = {
        "rotary, state cache": (rotary, decode_with_state_cache),
        "rotary, key/value cache": (rotary, decode_with_key_value_cache),
        "sinusoidal, state cache": (sinusoidal, decode_with_state_cache),
    }
    differences = {}
    for way, (decoder, decode) in ways.items():
        full = np.asarray(decoder(tokens))
        differences[way] = float(np.max(np.abs(decode(decoder, tokens) - full)))
    return differences


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--tiny",
        action="store_true",
        default=os.environ.get(TINY_ENVIRONMENT_VARIABLE, "") not in ("", "0"),
        help=f"decode 8 steps instead of 64 (also {TINY_ENVIRONMENT_VARIABLE}=1)",
    )
    args = parser.parse_args(argv)
    differences = run(tiny=args.tiny)
    print("max |token-by-token logits - full-sequence causal logits|:")
    for way, difference in differences.items():
        print(f"  {way:<26}{difference:.2e}")
    return differences


if __name__ == "__main__":
    main()
