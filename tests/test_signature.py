"""The serving function and its signature (`keras_posenc.export.signature`).

Expected values come from numpy (`reference.sinusoidal`, a Dense's own weights), never from
the serving function itself.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
import reference
import tensorflow as tf
from float32_error import assert_within_bound, linear_error, position_sum_error

from keras_posenc import LearnedPositionalEmbedding, SinusoidalPositionalEncoding
from keras_posenc.export import ExportError, signature

WIDTH = 8


def _encoder() -> keras.Model:
    x = keras.Input((None, WIDTH), name="embeddings")
    return keras.Model(x, {"encoded": SinusoidalPositionalEncoding(name="posenc")(x)})


def test_the_signature_keeps_fixed_sizes_and_leaves_batch_and_sequence_dynamic():
    tokens = keras.Input((16,), dtype="int32", name="tokens")
    features = keras.Input((None, 4), name="features")
    start = keras.Input((), dtype="int32", name="start", batch_size=1)
    model = keras.Model([tokens, features, start], [tokens, features, start])
    specs = signature.input_signature(model)
    assert [s.name for s in specs] == ["tokens", "features", "start"]
    assert [s.shape.as_list() for s in specs] == [[None, 16], [None, None, 4], [1]]
    assert [s.dtype for s in specs] == [tf.int32, tf.float32, tf.int32]


def test_an_unknown_inner_axis_and_a_model_without_inputs_are_refused():
    x = keras.Input((None, None), name="x")
    with pytest.raises(ExportError, match=r"only the batch \(axis 0\) and sequence"):
        signature.input_signature(keras.Model(x, x))
    with pytest.raises(TypeError, match="Expected a keras.Model"):
        signature.input_signature(keras.layers.Dense(2))
    with pytest.raises(ExportError, match="has no inputs to export"):
        signature.input_signature(keras.Sequential([keras.layers.Dense(2)]))


def test_the_serving_function_computes_the_model_at_any_length():
    serve = signature.serving_function(_encoder())
    x = np.random.default_rng(0).standard_normal((2, 37, WIDTH)).astype(np.float32)
    got = serve(tf.constant(x))
    assert set(got) == {"encoded"}
    expected = x + reference.sinusoidal(np.arange(37), WIDTH)
    assert_within_bound(got["encoded"].numpy(), expected, position_sum_error(x))
    # One trace, dynamic axes: another batch and length run through the same graph.
    serve(tf.constant(x[:1, :5]))
    assert serve.experimental_get_tracing_count() == 1


def test_outputs_are_named_by_dict_keys_else_output_names_else_by_position():
    dense = keras.layers.Dense(3, name="head")
    sequential = keras.Sequential([keras.Input((WIDTH,), name="x"), dense])
    x = np.ones((2, WIDTH), np.float32)
    outputs = signature.serving_function(sequential)(tf.constant(x))
    kernel, bias = (w.numpy() for w in dense.weights)
    assert list(outputs) in (["output_0"], ["head"])
    bound = linear_error(x, kernel, bias)
    assert_within_bound(next(iter(outputs.values())).numpy(), x @ kernel + bias, bound)

    a = keras.Input((WIDTH,), name="a")
    twice = keras.Model(a, [keras.layers.Identity(name="same")(a), keras.layers.Identity()(a)])
    names = list(signature.serving_function(twice)(tf.constant(x)))
    assert len(names) == 2 and len(set(names)) == 2


def test_layers_in_scopes_maps_traced_scopes_back_to_layer_paths():
    model = _encoder()
    scopes = ["functional_1/posenc_1/add", "posenc_2/Gather@fused", "other/op", "posenc/x"]
    assert signature.layers_in_scopes(model, scopes) == ["posenc"]
    assert signature.layers_in_scopes(model, ["unknown/op"]) == []


def test_the_export_bound_is_the_given_length_else_the_smallest_learned_table():
    x = keras.Input((None, WIDTH), name="x")
    short = LearnedPositionalEmbedding(10, name="short")(x)
    model = keras.Model(x, LearnedPositionalEmbedding(20, name="long")(short))
    assert signature.export_bound(model) == 10
    assert signature.export_bound(model, 7) == 7
    assert signature.export_bound(_encoder()) is None
    with pytest.raises(ValueError, match="longer than the model allows"):
        signature.export_bound(model, 11)
    with pytest.raises(ValueError, match="past 16777216"):
        signature.export_bound(_encoder(), 2**24 + 1)
    for bad in (0, True, 2.5):
        with pytest.raises(ValueError, match="positive integer or None"):
            signature.export_bound(model, bad)
