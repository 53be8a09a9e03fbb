"""Inputs the layers must refuse with a clear error, and inputs that must not be refused.

Each of these was once a silent wrong answer: an output in an integer dtype with the
table truncated into it, a rotation of half the channels, a batch broadcast to the
positions' batch, a string taken for True, an axis of 1.9 taken for 1. Also the memory
that a layer, a retrace or a crafted config may take.
"""

from __future__ import annotations

import gc
import tracemalloc
import weakref

import numpy as np
import pytest
import reference
import tensorflow as tf
from float32_error import assert_within_bound, position_sum_error, rotation_error

from keras_posenc import (
    LearnedPositionalEmbedding,
    RotaryEmbedding,
    SinusoidalPositionalEncoding,
    sinusoidal_table,
)

LAYERS = {
    "sinusoidal": lambda: SinusoidalPositionalEncoding(),
    "learned": lambda: LearnedPositionalEmbedding(64),
    "rotary": lambda: RotaryEmbedding(),
}


@pytest.fixture(params=list(LAYERS))
def make_layer(request):
    return LAYERS[request.param]


@pytest.mark.parametrize("dtype", ["int32", "int64", "bool", "complex64"])
def test_inputs_that_are_not_floats_are_refused(make_layer, dtype):
    x = tf.cast(tf.ones((1, 3, 8)), dtype)
    with pytest.raises(TypeError, match=rf"floating-point input, got dtype {dtype}"):
        make_layer()(x)


@pytest.mark.parametrize("name", list(LAYERS))
def test_a_policy_that_is_not_a_float_is_refused(name):
    layer_class = type(LAYERS[name]())
    arguments = {"max_length": 8} if name == "learned" else {}
    with pytest.raises(TypeError, match=r"floating-point dtype policy, got 'int32'"):
        layer_class(dtype="int32", **arguments)


@pytest.mark.parametrize("width", [1, 16])
def test_a_call_wider_or_narrower_than_the_built_width_is_refused(make_layer, width):
    layer = make_layer()
    layer(tf.zeros((1, 3, 8)))
    with pytest.raises(ValueError, match=r"built for inputs with 8 channels"):
        layer(tf.zeros((1, 3, width)))


def test_rotary_built_on_one_head_size_refuses_another():
    layer = RotaryEmbedding()
    layer(tf.zeros((1, 3, 2, 8)))
    with pytest.raises(ValueError, match=r"built for inputs with 8 channels"):
        layer(tf.zeros((1, 3, 2, 16)))  # once: rotated 8 of the 16 channels
    with pytest.raises(ValueError, match=r"built for inputs of rank 4"):
        layer(tf.zeros((1, 3, 8)))


def test_positions_of_another_batch_are_refused(make_layer):
    layer = make_layer()
    x = tf.zeros((1, 3, 8))
    with pytest.raises(ValueError, match=r"positions have a batch of 2 but the input has 1"):
        layer(x, positions=tf.constant([[0, 1, 2], [3, 4, 5]]))


def test_positions_of_another_batch_assert_in_a_graph(make_layer):
    layer = make_layer()
    call = tf.function(
        lambda x, p: layer(x, positions=p),
        input_signature=[tf.TensorSpec([None, None, 8]), tf.TensorSpec([None, None], tf.int32)],
    )
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"positions have a batch of"):
        call(tf.zeros((1, 3, 8)), tf.constant([[0, 1, 2], [3, 4, 5]]))


@pytest.mark.parametrize(
    ("arguments", "error", "pattern"),
    [
        ({"positions_from_mask": "False"}, TypeError, r"positions_from_mask must be True or False"),
        ({"positions_from_mask": 1}, TypeError, r"positions_from_mask must be True or False"),
        ({"sequence_axis": 1.9}, TypeError, r"sequence_axis must be an integer axis, got 1.9"),
        ({"feature_axis": True}, TypeError, r"feature_axis must be an integer axis, got True"),
        ({"max_wavelength": "10000"}, ValueError, r"max_wavelength must be a finite number"),
        ({"layout": ["half"]}, ValueError, r"Unknown layout"),
    ],
)
def test_rotary_constructor_values_of_the_wrong_type_are_refused(arguments, error, pattern):
    with pytest.raises(error, match=pattern):
        RotaryEmbedding(**arguments)


@pytest.mark.parametrize("length", [2.5, -1, True])
def test_sinusoidal_table_refuses_a_bad_length(length):
    with pytest.raises((TypeError, ValueError), match=r"length must be an integer"):
        sinusoidal_table(length, 8)


def test_a_python_int_start_past_int32_in_a_graph_is_a_range_error(make_layer):
    layer = make_layer()
    call = tf.function(
        lambda x: layer(x, start_index=2**31 + 5),
        input_signature=[tf.TensorSpec([None, None, 8])],
    )
    with pytest.raises(ValueError, match=r"start_index is 2147483653 but positions must stay"):
        call(tf.zeros((1, 3, 8)))


@pytest.mark.parametrize(
    "call",
    [{"start_index": np.int64(2**33)}, {"positions": np.arange(3, dtype=np.uint64) + 2**40}],
)
def test_numpy_integers_past_int32_are_refused_by_name(make_layer, call):
    # Before Keras converts them: JAX without x64 would keep their low 32 bits.
    (name,) = call
    with pytest.raises(ValueError, match=rf"{name} holds \d+, past int32"):
        make_layer()(tf.zeros((1, 3, 8)), **call)


@pytest.mark.parametrize("dtype", [tf.int8, tf.int16, tf.uint8, tf.uint16])
@pytest.mark.parametrize("jit", [False, True])
def test_narrow_integer_positions_give_the_right_rows(dtype, jit):
    layer = SinusoidalPositionalEncoding()
    encode = tf.function(lambda x, p: layer(x, positions=p), jit_compile=jit)
    positions = np.array([0, 5, 100, 127])
    outputs = encode(tf.zeros((1, 4, 8)), tf.constant(positions, dtype))
    expected = reference.sinusoidal(positions, 8)
    assert_within_bound(outputs[0], expected, position_sum_error(np.zeros(expected.shape)))


@pytest.mark.parametrize("dtype", [tf.int8, tf.uint16])
def test_narrow_integer_positions_rotate_right_under_xla(dtype):
    layer = RotaryEmbedding()
    rotate = tf.function(lambda x, p: layer(x, positions=p), jit_compile=True)
    x = np.random.default_rng(0).uniform(-1, 1, (1, 3, 2, 8)).astype(np.float32)
    positions = np.array([1, 7, 120])
    expected = reference.rotary(x, positions)
    bound = rotation_error(x)
    assert_within_bound(rotate(x, tf.constant(positions, dtype)), expected, bound)


# --------------------------------------------------------------------------------------
# Memory


def test_a_table_no_layer_holds_is_freed():
    layer = SinusoidalPositionalEncoding(max_wavelength=1234.5)
    layer(tf.zeros((1, 2, 8)))
    table = weakref.ref(layer._table)
    del layer
    gc.collect()
    assert table() is None


@pytest.mark.parametrize("name", ["sinusoidal", "rotary"])
def test_a_retrace_per_python_int_start_embeds_only_the_rows_it_uses(name):
    layer = LAYERS[name]()
    layer(tf.zeros((1, 1, 64)))
    step = tf.function(lambda x, start: layer(x, start_index=start))
    for start in (3, 4000, 9000):  # cached rows, across the cache, past it
        graph = step.get_concrete_function(tf.TensorSpec((1, 1, 64)), start).graph
        # The whole cached table alone is 4096 x 64 float32 values (1 MiB).
        assert graph.as_graph_def().ByteSize() < 64 * 1024, start


def test_a_crafted_config_allocates_nothing_before_it_is_validated():
    config = {**RotaryEmbedding().get_config(), "rotary_dim": 10**9}
    tracemalloc.start()
    try:
        layer = RotaryEmbedding.from_config(config)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 16 * 2**20
    with pytest.raises(ValueError, match=r"rotary_dim=1000000000 is larger than the feature"):
        layer(tf.zeros((1, 2, 8)))


def test_positions_of_another_batch_give_nan_under_xla(make_layer):
    # XLA drops the assertion above; the output may broadcast, but holds no finite row.
    layer = make_layer()
    call = tf.function(
        lambda x, p: layer(x, positions=p),
        input_signature=[tf.TensorSpec([None, None, 8]), tf.TensorSpec([None, None], tf.int32)],
        jit_compile=True,
    )
    outputs = call(tf.zeros((1, 3, 8)), tf.constant([[0, 1, 2], [3, 4, 5]])).numpy()
    assert np.isnan(outputs).all()
