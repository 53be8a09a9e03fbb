"""The Keras contract, once for every layer: config, `.keras` files, masks, shapes, dtypes, weights.

Each layer is built with non-default arguments, so that a round trip that forgot one of
them shows. What the layers compute is tested against float64 references in their own
files; here each clone is compared with its original.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable

import keras
import numpy as np
import pytest
import tensorflow as tf
from float32_error import U, assert_within_bound, gamma

from keras_posenc import (
    LearnedPositionalEmbedding,
    RotaryEmbedding,
    RotaryGroupQueryAttention,
    RotaryMultiHeadAttention,
    SinusoidalPositionalEncoding,
)


@dataclasses.dataclass(frozen=True)
class LayerCase:
    """A layer with non-default arguments, the input shape it takes, and its weight count."""

    make: Callable[[], keras.layers.Layer]
    shape: tuple  # without the batch axis
    weights: int  # number of weight values
    attention: type | None = None  # the Keras attention layer it extends

    def call(self, layer, x, **kwargs):
        return layer(x, x, **kwargs) if self.attention else layer(x, **kwargs)


CASES = {
    "sinusoidal": LayerCase(
        lambda: SinusoidalPositionalEncoding(
            max_wavelength=500.0, layout="concat", frequency_spacing="tensor2tensor", name="pe"
        ),
        (None, 8),
        0,
    ),
    "learned": LayerCase(
        lambda: LearnedPositionalEmbedding(
            12,
            embeddings_initializer="sinusoidal",
            embeddings_regularizer="l2",
            embeddings_constraint="non_neg",
            name="positions",
        ),
        (None, 8),
        12 * 8,
    ),
    "rotary": LayerCase(
        lambda: RotaryEmbedding(
            max_wavelength=77.0,
            layout="interleaved",
            rotary_dim=4,
            scaling={"rope_type": "linear", "factor": 2.0},
            positions_from_mask=True,
            name="rope",
        ),
        (None, 2, 6),
        0,
    ),
    "rotary_flat": LayerCase(lambda: RotaryEmbedding(max_wavelength=300.0), (None, 6), 0),
    "rotary_attention": LayerCase(
        lambda: RotaryMultiHeadAttention(
            num_heads=2, key_dim=4, rope_max_wavelength=500.0, rope_dim=2, name="attention"
        ),
        (None, 8),
        # query, key and value kernels and biases (8 -> 2 x 4), output kernel and bias
        3 * (8 * 2 * 4 + 2 * 4) + (2 * 4 * 8 + 8),
        attention=keras.layers.MultiHeadAttention,
    ),
    "rotary_group_query_attention": LayerCase(
        lambda: RotaryGroupQueryAttention(
            4, 2, 1, rope_dim=2, rope_layout="interleaved", name="group_query_attention"
        ),
        (None, 8),
        # query kernel and bias (8 -> 2 x 4), key and value (8 -> 1 x 4), output (2 x 4 -> 8)
        (8 * 2 * 4 + 2 * 4) + 2 * (8 * 1 * 4 + 4) + (2 * 4 * 8 + 8),
        attention=keras.layers.GroupQueryAttention,
    ),
    "rotary_group_query_attention_mrope": LayerCase(
        lambda: RotaryGroupQueryAttention(
            4,
            2,
            1,
            rope_mrope_section=(1, 1),
            rope_mrope_interleaved=True,
            positions_from_mask=True,
            name="mrope_attention",
        ),
        (None, 8),
        (8 * 2 * 4 + 2 * 4) + 2 * (8 * 1 * 4 + 4) + (2 * 4 * 8 + 8),
        attention=keras.layers.GroupQueryAttention,
    ),
    "rotary_attention_query_key_norm": LayerCase(
        lambda: RotaryMultiHeadAttention(
            num_heads=2,
            key_dim=4,
            query_key_norm="rms_across_heads",
            query_key_norm_epsilon=1e-5,
            name="normed_attention",
        ),
        (None, 8),
        # as rotary_attention, and a scale per query and per key channel (2 x 4 each)
        3 * (8 * 2 * 4 + 2 * 4) + (2 * 4 * 8 + 8) + 2 * (2 * 4),
        attention=keras.layers.MultiHeadAttention,
    ),
    "rotary_group_query_attention_query_key_norm": LayerCase(
        lambda: RotaryGroupQueryAttention(
            4,
            2,
            1,
            query_key_norm="gemma_rms_per_head",
            query_key_norm_epsilon=1e-5,
            name="normed_group_query_attention",
        ),
        (None, 8),
        # as rotary_group_query_attention, and one scale of head_dim for queries, one for keys
        (8 * 2 * 4 + 2 * 4) + 2 * (8 * 1 * 4 + 4) + (2 * 4 * 8 + 8) + 2 * 4,
        attention=keras.layers.GroupQueryAttention,
    ),
}


@pytest.fixture(params=list(CASES))
def case(request) -> LayerCase:
    return CASES[request.param]


def _inputs(case: LayerCase, batch: int = 2, length: int = 7, seed: int = 0) -> np.ndarray:
    shape = (batch, length, *case.shape[1:])
    return np.random.default_rng(seed).uniform(-1, 1, shape).astype(np.float32)


def _plain(case: LayerCase):
    """The Keras attention layer the case's layer extends, with the same heads."""
    if case.attention is keras.layers.MultiHeadAttention:
        return keras.layers.MultiHeadAttention(num_heads=2, key_dim=4)
    return keras.layers.GroupQueryAttention(4, 2, 1)


def _built(case: LayerCase):
    layer = case.make()
    case.call(layer, _inputs(case))
    return layer


def test_config_lists_exactly_the_constructor_arguments(case):
    layer = case.make()
    config = layer.get_config()
    own = set(inspect.signature(type(layer).__init__).parameters) - {"self", "kwargs"}
    base = set(keras.layers.Layer().get_config())
    if case.attention:
        parent = _plain(case).get_config()
        base |= set(parent)
    assert own <= set(config)
    assert set(config) - base == own - base


def test_config_round_trip_gives_the_same_layer(case):
    layer = _built(case)
    config = layer.get_config()
    clone = type(layer).from_config(config)
    assert clone.get_config() == config
    x = _inputs(case, seed=1)
    case.call(clone, x)
    clone.set_weights(layer.get_weights())
    np.testing.assert_array_equal(case.call(clone, x), case.call(layer, x))


def test_keras_file_round_trip(case, tmp_path):
    inputs = keras.Input(case.shape)
    outputs = case.call(case.make(), inputs)
    model = keras.Model(inputs, keras.layers.Dense(3)(outputs))
    path = tmp_path / "model.keras"
    model.save(path)
    loaded = keras.models.load_model(path)
    original = next(la for la in model.layers if la.name == outputs._keras_history[0].name)
    restored = loaded.get_layer(original.name)
    assert type(restored) is type(original)
    assert restored.get_config() == original.get_config()
    x = _inputs(case, seed=2, length=11)
    np.testing.assert_array_equal(loaded(x), model(x))


@pytest.mark.parametrize("name", [n for n, c in CASES.items() if not c.attention])
def test_mask_passes_through(name):
    case = CASES[name]
    ids = np.array([[3, 1, 4, 0, 0, 0, 0], [2, 0, 0, 0, 0, 0, 0]])
    width = int(np.prod(case.shape[1:]))
    embedded = keras.layers.Embedding(10, width, mask_zero=True)(ids)
    embedded = tf.reshape(embedded, (2, 7, *case.shape[1:]))
    embedded._keras_mask = tf.constant(ids != 0)
    outputs = case.make()(embedded)
    np.testing.assert_array_equal(outputs._keras_mask, ids != 0)


@pytest.mark.parametrize("name", ["sinusoidal", "learned", "rotary_flat"])
def test_mask_reaches_the_next_layer_of_a_functional_model(name):
    case = CASES[name]
    ids = keras.Input((None,), dtype="int32")
    embedded = keras.layers.Embedding(10, case.shape[-1], mask_zero=True)(ids)
    positioned = case.make()(embedded)
    pooled = keras.layers.GlobalAveragePooling1D()(positioned)
    model = keras.Model(ids, pooled)
    tokens = np.array([[3, 1, 4, 0, 0], [2, 0, 0, 0, 0]])
    unpadded = model(tokens[:1, :3])
    # The three real rows are the same elementwise sums either way; the masked mean of
    # each run sums them (and zeros) in some order, `γ_4 Σ|h|`, and divides once.
    rows = np.abs(np.asarray(keras.Model(ids, positioned)(tokens[:1, :3]), np.float64))
    mean = rows.sum(1) / 3
    bound = 2 * (gamma(4) * mean + U * (mean + gamma(4) * mean))
    assert_within_bound(model(tokens)[:1], np.asarray(unpadded), bound, what=name)


def test_output_shape_static_and_symbolic(case):
    layer = case.make()
    symbolic = case.call(layer, keras.Input(case.shape))
    assert tuple(symbolic.shape) == (None, *case.shape)
    if not case.attention:
        assert tuple(layer.compute_output_shape((2, None, *case.shape[1:]))) == (
            2,
            None,
            *case.shape[1:],
        )
    fixed = case.call(case.make(), tf.zeros((2, 5, *case.shape[1:])))
    assert tuple(fixed.shape) == (2, 5, *case.shape[1:])


def test_graph_outputs_keep_the_static_shape(case):
    layer = _built(case)
    shape = (3, None, *case.shape[1:])

    @tf.function(input_signature=[tf.TensorSpec(shape), tf.TensorSpec([], tf.int32)])
    def from_start(x, start):
        if case.attention:
            return layer(x, x, query_start_index=start, key_start_index=start)
        return layer(x, start_index=start)

    traced = from_start.get_concrete_function().structured_outputs
    assert traced.shape.as_list() == list(shape)


@pytest.mark.parametrize(
    ("policy", "compute", "variable"),
    [
        ("float32", "float32", "float32"),
        ("mixed_float16", "float16", "float32"),
        ("mixed_bfloat16", "bfloat16", "float32"),
        ("float64", "float64", "float64"),
    ],
)
def test_dtype_policies(case, policy, compute, variable):
    layer = case.make()
    config = {**layer.get_config(), "dtype": policy}
    layer = type(layer).from_config(config)
    x = tf.cast(_inputs(case), compute)
    outputs = case.call(layer, x)
    assert outputs.dtype == compute
    assert np.isfinite(np.asarray(tf.cast(outputs, "float32"))).all()
    assert all(w.dtype == variable for w in layer.weights)


def test_weight_counts(case):
    layer = _built(case)
    assert sum(int(np.prod(w.shape)) for w in layer.weights) == case.weights
    if case.attention:
        plain = _plain(case)
        x = _inputs(case)
        plain(x, x)
        ours = [tuple(w.shape) for w in layer.weights]
        assert ours[: len(plain.weights)] == [tuple(w.shape) for w in plain.weights]
        # After the base layer's own: the q/k norms' scales, when the layer has them.
        extra = [w.path.split("/")[-2:] for w in layer.weights[len(plain.weights) :]]
        has_scales = layer.get_config().get("query_key_norm") is not None
        assert extra == ([["query_norm", "scale"], ["key_norm", "scale"]] if has_scales else [])


@pytest.mark.parametrize("jit_compile", [False, True])
def test_a_training_step_reaches_the_weights_before_and_in_the_layer(case, jit_compile):
    inputs = keras.Input(case.shape)
    projected = keras.layers.Dense(case.shape[-1], name="before")(inputs)
    outputs = case.call(case.make(), projected)
    flat = keras.layers.Reshape((-1, int(np.prod(case.shape[1:]))))(outputs)
    pooled = keras.layers.GlobalAveragePooling1D()(flat)
    model = keras.Model(inputs, keras.layers.Dense(1)(pooled))
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse", jit_compile=jit_compile)
    before = [np.array(w) for w in model.trainable_weights]
    x = _inputs(case, batch=4)
    history = model.fit(x, np.ones((4, 1)), epochs=2, batch_size=4, verbose=0)
    assert np.all(np.isfinite(history.history["loss"]))
    changed = [
        not np.array_equal(b, np.array(w))
        for b, w in zip(before, model.trainable_weights, strict=True)
    ]
    unchanged = [w.path for w, c in zip(model.trainable_weights, changed, strict=True) if not c]
    assert not unchanged
