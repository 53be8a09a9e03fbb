"""The key/value cache's parts (`keras_posenc.layers.kv_cache`), against numpy on the same
arrays."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from keras_posenc.layers import kv_cache as _kv_cache

MAX_LENGTH = 6


def _numpy_written(cache: np.ndarray, update: np.ndarray, index: int) -> np.ndarray:
    expected = cache.copy()
    expected[:, :, index : index + update.shape[2]] = update
    return expected


def test_known_int_reads_numbers_and_constants_and_refuses_bools():
    assert _kv_cache.known_int(3) == 3
    assert _kv_cache.known_int(np.int64(4)) == 4
    assert _kv_cache.known_int(tf.constant(5)) == 5
    with pytest.raises(TypeError, match="must be an integer .*, got True"):
        _kv_cache.known_int(True)

    seen = []

    @tf.function(input_signature=[tf.TensorSpec([], tf.int32)])
    def traced(index):
        seen.append(_kv_cache.known_int(index))
        return index

    traced(tf.constant(1))
    assert seen == [None]  # a run-time index is not known while tracing


def test_update_index_of_a_wide_type_saturates_to_int32():
    seen = []

    @tf.function(input_signature=[tf.TensorSpec([], tf.int64)])
    def traced(index):
        checked = _kv_cache.checked_update_index(index)
        seen.append(checked.dtype)
        return checked

    assert int(traced(tf.constant(2**40, tf.int64))) == np.iinfo(np.int32).max
    assert int(traced(tf.constant(-(2**40), tf.int64))) == np.iinfo(np.int32).min
    assert int(traced(tf.constant(7, tf.int64))) == 7
    assert seen == [tf.int32]


@pytest.mark.parametrize("bad", [tf.constant(1.0), tf.constant([1, 2])])
def test_update_index_must_be_an_integer_scalar(bad):
    @tf.function(input_signature=[tf.TensorSpec(bad.shape, bad.dtype)])
    def traced(index):
        return _kv_cache.checked_update_index(index)

    with pytest.raises(TypeError, match="cache_update_index must be (an integer|a scalar)"):
        traced(bad)


def test_static_size_is_an_int_when_known_else_a_tensor():
    seen = []

    @tf.function(input_signature=[tf.TensorSpec([2, None], tf.float32)])
    def traced(x):
        seen.extend([_kv_cache.static_size(x, 0), _kv_cache.static_size(x, 1)])
        return x

    traced(tf.zeros([2, 3]))
    assert seen[0] == 2 and isinstance(seen[0], int)
    assert tf.is_tensor(seen[1])


@pytest.mark.parametrize("start", [0, 2, 5])
def test_columns_are_the_run_of_columns_from_start_clamped_at_the_end(start):
    x = np.arange(2 * MAX_LENGTH * 3, dtype=np.float32).reshape(2, MAX_LENGTH, 3)
    got = _kv_cache.columns(tf.constant(x), tf.constant(start), 3).numpy()
    steps = np.minimum(start + np.arange(3), MAX_LENGTH - 1)
    np.testing.assert_array_equal(got, x[:, steps])


@pytest.mark.parametrize("jit", [False, True])
@pytest.mark.parametrize("index, new", [(0, 2), (3, 3), (5, 1)])
def test_written_puts_the_update_at_the_index_and_keeps_the_rest(jit, index, new):
    rng = np.random.default_rng([index, new])
    cache = rng.standard_normal((2, 2, MAX_LENGTH, 1, 4)).astype(np.float32)
    update = rng.standard_normal((2, 2, new, 1, 4)).astype(np.float32)

    @tf.function(jit_compile=jit, autograph=False)
    def write(cache, update, index):
        return _kv_cache.written(cache, update, index, new, MAX_LENGTH)

    got = write(tf.constant(cache), tf.constant(update), tf.constant(index)).numpy()
    np.testing.assert_array_equal(got, _numpy_written(cache, update, index))


def test_slots_that_fit_are_checked_now_and_those_that_do_not_raise():
    assert _kv_cache.checked_slots(0, 2, MAX_LENGTH) is None
    assert _kv_cache.checked_slots(MAX_LENGTH - 2, 2, MAX_LENGTH) is None
    with pytest.raises(ValueError, match=r"must be in \[0, 4\]"):
        _kv_cache.checked_slots(5, 2, MAX_LENGTH)
    with pytest.raises(ValueError, match="does not fit"):
        _kv_cache.checked_slots(-1, 1, MAX_LENGTH)


def test_slots_known_at_run_time_only_are_asserted_in_a_graph():
    @tf.function(input_signature=[tf.TensorSpec([], tf.int32)])
    def valid(index):
        return _kv_cache.checked_slots(index, 2, MAX_LENGTH)

    assert bool(valid(tf.constant(4)))
    with pytest.raises(tf.errors.InvalidArgumentError, match="max_length 6"):
        valid(tf.constant(5))


@pytest.mark.parametrize(
    "causal, window, chunk",
    [(False, None, None), (True, None, None), (True, 2, None), (True, None, 3)],
)
def test_visible_slots_are_the_filled_ones_each_query_may_see(causal, window, chunk):
    index, steps = 2, 3
    cache_mask = np.array([[1, 1, 0, 1, 1, 1], [1, 1, 1, 1, 1, 0]], bool)
    query_mask = np.array([[1, 1, 1], [1, 0, 1]], bool)
    got = _kv_cache.visible_slots(
        (index, steps, steps, MAX_LENGTH), causal, (window, chunk), (cache_mask, query_mask, None)
    ).numpy()
    slot, query = np.arange(MAX_LENGTH), index + np.arange(steps)
    expected = np.broadcast_to(slot < index + steps, (2, steps, MAX_LENGTH)).copy()
    if causal:
        expected &= slot[None, :] <= query[:, None]
    if window is not None:
        expected &= np.abs(query[:, None] - slot[None, :]) < window
    if chunk is not None:  # Llama 4: slots 0-2 and 3-5
        expected &= (query[:, None] < 3) == (slot[None, :] < 3)
    expected &= cache_mask[:, None, :] & query_mask[:, :, None]
    np.testing.assert_array_equal(got, expected)


def test_a_cache_of_the_wrong_shape_or_sizes_is_refused():
    cache, max_length = _kv_cache.checked_cache(np.zeros((1, 2, 5, 3, 4), np.float32), 3, 4, 4)
    assert max_length == 5 and tf.is_tensor(cache)
    with pytest.raises(ValueError, match="one size"):
        _kv_cache.checked_cache(np.zeros((1, 2, 5, 3, 4)), 3, 4, 8)
    with pytest.raises(ValueError, match=r"= \(batch, 2, max_length, 3, 4\)"):
        _kv_cache.checked_cache(np.zeros((1, 2, 5, 2, 4)), 3, 4, 4)
    with pytest.raises(ValueError, match=r"max_length=5"):
        _kv_cache.checked_cache_mask(np.ones((1, 4), bool), 5)
    assert _kv_cache.checked_cache_mask(None, 5) is None
    with pytest.raises(ValueError, match="not start indices"):
        _kv_cache.checked_cache_call(False, None, None, (None, 1), (None, 0))
    with pytest.raises(ValueError, match="cache_mask"):
        _kv_cache.checked_cache_call(False, np.ones((1, 2)), None, (None, 0), (None, 0))
