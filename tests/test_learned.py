"""`LearnedPositionalEmbedding`: `inputs + E[positions]`, resizing, and its errors."""

from __future__ import annotations

import keras
import ml_dtypes
import numpy as np
import pytest
import reference
import tensorflow as tf
from float32_error import U, assert_within_bound, position_sum_error
from hypothesis import given
from hypothesis import strategies as st

from keras_posenc import LearnedPositionalEmbedding, SinusoidalInitializer

MAX_LENGTH = 64
WIDTH = 6


def _table(layer) -> np.ndarray:
    return keras.ops.convert_to_numpy(layer.embeddings).astype(np.float64)


def test_adds_the_rows_of_its_positions(in_mode, positions_case, position_kind):
    batch, length = 2, 9
    case = positions_case(position_kind, batch, length, limit=MAX_LENGTH)
    layer = LearnedPositionalEmbedding(MAX_LENGTH)
    layer.build((None, None, WIDTH))
    embed = in_mode(case.bind(layer), case.signature(tf.TensorSpec([None, None, WIDTH])))
    x = np.random.default_rng(0).normal(size=(batch, length, WIDTH)).astype(np.float32)
    outputs = embed(*case.arguments(x))
    assert outputs.dtype == tf.float32 and outputs.shape == (batch, length, WIDTH)
    rows = _table(layer)[case.positions]  # float32 rows: the sum's rounding alone
    assert_within_bound(outputs, x + rows, position_sum_error(x, 0.0, np.abs(rows)))


def test_dynamic_sequence_length_in_one_trace(in_mode):
    layer = LearnedPositionalEmbedding(MAX_LENGTH)
    embed = in_mode(
        lambda x, s: layer(x, start_index=s),
        [tf.TensorSpec([None, None, WIDTH]), tf.TensorSpec([], tf.int32)],
    )
    for length, start in [(1, 0), (5, 59), (MAX_LENGTH, 0), (3, 17)]:
        outputs = embed(tf.zeros((2, length, WIDTH)), tf.constant(start))
        np.testing.assert_array_equal(outputs[1], _table(layer)[start : start + length])


@given(start=st.integers(0, MAX_LENGTH - 1), data=st.data())
def test_start_index_gives_exactly_the_positions_of_its_run(start, data):
    length = data.draw(st.integers(1, MAX_LENGTH - start))
    layer = LearnedPositionalEmbedding(MAX_LENGTH)
    x = tf.random.normal((2, length, WIDTH))
    by_positions = layer(x, positions=np.arange(start, start + length))
    np.testing.assert_array_equal(layer(x, start_index=start), by_positions)
    np.testing.assert_array_equal(layer(x, start_index=tf.constant(start)), by_positions)


def test_trains():
    layer = LearnedPositionalEmbedding(8, embeddings_initializer="zeros")
    x = tf.zeros((1, 3, WIDTH))
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(layer(x, positions=[1, 1, 4]))
    (gradient,) = tape.gradient(loss, layer.trainable_weights)
    expected = np.zeros((8, WIDTH))
    expected[1], expected[4] = 2.0, 1.0
    np.testing.assert_array_equal(tf.convert_to_tensor(gradient), expected)


# --- Initializers ------------------------------------------------------------------------


@pytest.mark.parametrize("initializer", ["sinusoidal", SinusoidalInitializer()])
def test_sinusoidal_initializer_starts_from_the_encoding(initializer):
    layer = LearnedPositionalEmbedding(5000, embeddings_initializer=initializer)
    layer.build((None, None, 10))
    expected = reference.sinusoidal(np.arange(5000), 10).astype(np.float32)
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(layer.embeddings), expected)


def test_concat_sinusoidal_initializer_round_trips_through_the_config():
    initializer = SinusoidalInitializer(max_wavelength=100.0, layout="concat")
    layer = LearnedPositionalEmbedding(50, embeddings_initializer=initializer)
    clone = LearnedPositionalEmbedding.from_config(layer.get_config())
    clone.build((None, None, 8))
    expected = reference.sinusoidal(np.arange(50), 8, 100.0, "concat").astype(np.float32)
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(clone.embeddings), expected)


def test_keras_initializers_by_name():
    layer = LearnedPositionalEmbedding(4, embeddings_initializer="ones")
    np.testing.assert_array_equal(layer(tf.zeros((1, 4, 2))), np.ones((1, 4, 2)))


# --- resize ------------------------------------------------------------------------------


@pytest.mark.parametrize("new_length", [2, 17, 64, 100, 1000])
def test_resize_interpolates_linearly(new_length):
    layer = LearnedPositionalEmbedding(MAX_LENGTH)
    layer.build((None, None, WIDTH))
    old = _table(layer)
    layer.resize(new_length)
    assert layer.max_length == new_length
    assert layer.get_config()["max_length"] == new_length
    assert len(layer.weights) == len(layer.trainable_weights) == 1
    assert tuple(layer.embeddings.shape) == (new_length, WIDTH)
    expected = reference.linear_resize(old, new_length)
    # Interpolated in float64 (np.interp and the layer's formula a few float64 ulps apart),
    # then rounded once to float32.
    rows_error = U * np.abs(expected) + 2.0**-50 * np.abs(old).max()
    assert_within_bound(_table(layer), expected, rows_error, what="resized rows")
    # The resized table serves the new lengths: one float32 sum with those rows.
    x = np.random.default_rng(1).normal(size=(1, new_length, WIDTH)).astype(np.float32)
    bound = position_sum_error(x, rows_error, np.abs(expected))
    assert_within_bound(layer(x), x + expected[None], bound, what="x + rows")


def test_resize_from_and_to_a_single_row():
    layer = LearnedPositionalEmbedding(1, embeddings_initializer="ones")
    layer.build((None, None, 2))
    layer.resize(3)
    np.testing.assert_array_equal(_table(layer), np.ones((3, 2)))
    layer.resize(1)
    np.testing.assert_array_equal(_table(layer), np.ones((1, 2)))


def test_resize_before_build_sets_the_length():
    layer = LearnedPositionalEmbedding(8)
    layer.resize(20)
    assert layer(tf.zeros((1, 20, 4))).shape == (1, 20, 4)
    assert tuple(layer.embeddings.shape) == (20, 4)


def test_resized_table_trains_and_saves(tmp_path):
    inputs = keras.Input((None, WIDTH))
    layer = LearnedPositionalEmbedding(16)
    model = keras.Model(inputs, layer(inputs))
    layer.resize(40)
    assert [w.shape for w in model.trainable_weights] == [(40, WIDTH)]
    x = np.random.default_rng(2).normal(size=(2, 40, WIDTH)).astype(np.float32)
    path = tmp_path / "resized.keras"
    model.save(path)
    loaded = keras.models.load_model(path)
    assert loaded.layers[1].max_length == 40
    np.testing.assert_array_equal(loaded(x), model(x))


@pytest.mark.parametrize("bad", [0, -3, 2.5, True, None])
def test_resize_rejects_bad_lengths(bad):
    layer = LearnedPositionalEmbedding(8)
    with pytest.raises(ValueError, match=rf"max_length must be a positive integer, got {bad!r}"):
        layer.resize(bad)


# --- Dtype policies ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("policy", "numpy_dtype", "mantissa_bits"),
    [
        pytest.param("mixed_bfloat16", ml_dtypes.bfloat16, 7, id="bfloat16"),
        pytest.param("mixed_float16", np.float16, 10, id="float16"),
    ],
)
def test_mixed_precision_keeps_a_float32_table_and_rounds_the_result_once(
    policy, numpy_dtype, mantissa_bits
):
    layer = LearnedPositionalEmbedding(MAX_LENGTH, dtype=policy)
    x = np.random.default_rng(3).uniform(-1, 1, (4, MAX_LENGTH, WIDTH)).astype(numpy_dtype)
    outputs = layer(x)
    assert layer.embeddings.dtype == "float32"
    assert outputs.dtype == tf.as_dtype(policy.removeprefix("mixed_"))
    exact = x.astype(np.float64) + _table(layer)
    reference.assert_rounded_once(outputs.numpy(), exact, mantissa_bits)


# --- Errors ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "pattern"),
    [
        ({"start_index": 60}, r"run to 69 .*within 64"),
        ({"start_index": tf.constant(56)}, r"run to 65 .*within 64"),
        ({"positions": [0, 1, 2, 3, 4, 5, 6, 7, 64]}, r"largest position is 64 .*below 64"),
    ],
)
def test_positions_past_the_table_are_errors_naming_both_numbers(kwargs, pattern):
    layer = LearnedPositionalEmbedding(MAX_LENGTH)
    with pytest.raises(ValueError, match=pattern + r".*resize"):
        layer(tf.zeros((1, 9, WIDTH)), **kwargs)


def test_negative_positions_are_an_error_naming_the_value():
    with pytest.raises(ValueError, match=r"positions must be >= 0.*-1"):
        LearnedPositionalEmbedding(MAX_LENGTH)(tf.zeros((1, 3, WIDTH)), positions=[0, -1, 2])


def test_a_sequence_longer_than_the_table_is_an_error():
    with pytest.raises(ValueError, match=r"run to 65 .*within 64"):
        LearnedPositionalEmbedding(MAX_LENGTH)(tf.zeros((1, 65, WIDTH)))


def test_graph_mode_length_past_the_table_asserts_naming_both_numbers():
    layer = LearnedPositionalEmbedding(8)
    embed = tf.function(
        lambda x, s: layer(x, start_index=s),
        input_signature=[tf.TensorSpec([None, None, 4]), tf.TensorSpec([], tf.int32)],
    )
    # The message shows start_index, then the sequence length.
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"within 8(.|\n)*\[6\](.|\n)*\[5\]"):
        embed(tf.zeros((1, 5, 4)), tf.constant(6))
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"within 8(.|\n)*\[0\](.|\n)*\[9\]"):
        embed(tf.zeros((1, 9, 4)), tf.constant(0))
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"start_index must be >= 0(.|\n)*-1"):
        embed(tf.zeros((1, 2, 4)), tf.constant(-1))


def test_graph_mode_positions_past_the_table_assert_naming_both_numbers():
    layer = LearnedPositionalEmbedding(8)
    embed = tf.function(
        lambda x, p: layer(x, positions=p),
        input_signature=[tf.TensorSpec([None, None, 4]), tf.TensorSpec([None, None], tf.int64)],
    )
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"below 8(.|\n)*\[12\]"):
        embed(tf.zeros((1, 2, 4)), tf.constant([[3, 12]], tf.int64))


@pytest.mark.parametrize("max_length", [0, -1, 3.0, "8", None, True])
def test_bad_max_length_is_an_error(max_length):
    with pytest.raises(ValueError, match=r"max_length must be a positive integer"):
        LearnedPositionalEmbedding(max_length)


@pytest.mark.parametrize("shape", [(3, 4), (1, 2, 3, 4)])
def test_wrong_input_rank_is_an_error_naming_the_shape(shape):
    with pytest.raises(ValueError, match=r"\(batch, sequence, width\)"):
        LearnedPositionalEmbedding(8)(tf.zeros(shape))


@pytest.mark.parametrize(
    ("positions", "error", "pattern"),
    [
        ([[[0, 1, 2]]], ValueError, r"\(sequence,\) or \(batch, sequence\)"),
        ([0, 1], ValueError, r"positions cover 2 steps but the input sequence has 3"),
        ([0.0, 1.0, 2.0], TypeError, r"integers.*tf.cast"),
    ],
)
def test_bad_positions_are_errors(positions, error, pattern):
    with pytest.raises(error, match=pattern):
        LearnedPositionalEmbedding(8)(tf.zeros((1, 3, 4)), positions=tf.constant(positions))


def test_under_xla_a_run_past_the_table_gives_nan_not_a_clamped_row():
    """XLA drops assertions and clamps gathers: the layer poisons the rows instead."""
    layer = LearnedPositionalEmbedding(8)
    embed = tf.function(lambda x, s: layer(x, start_index=s), jit_compile=True)
    x = tf.zeros((1, 5, 4))
    assert np.isfinite(embed(x, tf.constant(3)).numpy()).all()
    assert np.isnan(embed(x, tf.constant(6)).numpy()).all()  # rows 6..10 of 8
    assert np.isnan(embed(x, tf.constant(-1)).numpy()).all()
