"""Run-time start indices at the edges of int32, for every layer
(keras_posenc/tables/positions.py)."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from keras_posenc import LearnedPositionalEmbedding, RotaryEmbedding, SinusoidalPositionalEncoding

LAYERS = {
    "sinusoidal": lambda: SinusoidalPositionalEncoding(),
    "rotary": lambda: RotaryEmbedding(),
    "learned": lambda: LearnedPositionalEmbedding(64),
}
# start + 16 steps wraps around in int32; 2^32 + 5 is 5 once cast to int32.
STARTS = [(2**31 - 10, tf.int32), (2**31 - 10, tf.int64), (2**32 + 5, tf.int64), (2**40, tf.int64)]


@pytest.mark.parametrize("layer_name", LAYERS)
@pytest.mark.parametrize(("start", "dtype"), STARTS)
def test_a_start_past_int32_is_an_error_in_a_graph(layer_name, start, dtype):
    layer = LAYERS[layer_name]()
    encode = tf.function(
        lambda x, s: layer(x, start_index=s),
        input_signature=[tf.TensorSpec([None, None, 8]), tf.TensorSpec([], dtype)],
    )
    with pytest.raises(tf.errors.InvalidArgumentError, match="must stay within"):
        encode(tf.zeros((1, 16, 8)), tf.constant(start, dtype))


@pytest.mark.parametrize("layer_name", LAYERS)
@pytest.mark.parametrize(("start", "dtype"), STARTS)
def test_a_start_past_int32_gives_nan_under_xla(layer_name, start, dtype):
    layer = LAYERS[layer_name]()
    encode = tf.function(lambda x, s: layer(x, start_index=s), jit_compile=True)
    x = tf.ones((1, 16, 8))
    assert np.isfinite(encode(x, tf.constant(5, dtype)).numpy()).all()
    assert np.isnan(encode(x, tf.constant(start, dtype)).numpy()).all()


@pytest.mark.parametrize("layer_name", LAYERS)
def test_a_start_past_int32_is_an_error_eagerly(layer_name):
    with pytest.raises(ValueError, match=r"run to 2147483654"):
        LAYERS[layer_name]()(tf.zeros((1, 16, 8)), start_index=2**31 - 10)
