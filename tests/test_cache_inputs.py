"""Cache inputs that used to be answered silently, or refused with errors naming other things."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from keras_posenc import RotaryGroupQueryAttention, RotaryMultiHeadAttention

HEAD_DIM, MAX_LENGTH, WIDTH = 8, 6, 16


def _layer():
    layer = RotaryGroupQueryAttention(HEAD_DIM, 4, 2)
    layer(np.zeros((1, 2, WIDTH), np.float32), np.zeros((1, 2, WIDTH), np.float32))
    return layer


def _cache(batch=1, dtype="float32"):
    return np.zeros((batch, 2, MAX_LENGTH, 2, HEAD_DIM), dtype)


def _tokens(batch=1, steps=1):
    return np.random.default_rng(0).normal(size=(batch, steps, WIDTH)).astype(np.float32)


@pytest.mark.parametrize("index", [1.5, np.float32(1.9), "1", tf.constant(1.0), 1.0], ids=repr)
def test_a_cache_update_index_that_is_not_an_integer_is_refused(index):
    x = _tokens()
    with pytest.raises(TypeError, match="cache_update_index must be an integer"):
        _layer()(x, x, cache=_cache(), cache_update_index=index)


@pytest.mark.parametrize("index", [np.array([1]), tf.constant([1])], ids=["numpy", "tensor"])
def test_a_cache_update_index_that_is_not_a_scalar_is_refused(index):
    x = _tokens()
    with pytest.raises(TypeError, match=r"cache_update_index must be a scalar, got shape \(1,\)"):
        _layer()(x, x, cache=_cache(), cache_update_index=index)


def test_an_integer_cache_is_refused_rather_than_truncating_the_keys():
    x = _tokens()
    with pytest.raises(
        TypeError, match="cache must hold floating-point keys and values, got int32"
    ):
        _layer()(x, x, cache=_cache(dtype="int32"), cache_update_index=0)


@pytest.mark.parametrize("cache_batch", [1, 3])
def test_a_cache_whose_batch_differs_from_the_queries_is_refused(cache_batch):
    x = _tokens(batch=2)
    with pytest.raises(ValueError, match=f"cache has batch {cache_batch} but the queries 2"):
        _layer()(x, x, cache=_cache(cache_batch), cache_update_index=0)


def test_in_a_graph_a_cache_of_another_batch_fails_or_is_nan_never_broadcast():
    layer = _layer()
    step = tf.function(
        lambda x, cache: layer(x, x, cache=cache, cache_update_index=0),
        input_signature=[
            tf.TensorSpec([None, 1, WIDTH]),
            tf.TensorSpec([None, 2, MAX_LENGTH, 2, HEAD_DIM]),
        ],
    )
    x = _tokens(batch=2)
    with pytest.raises(tf.errors.InvalidArgumentError, match="batch"):
        step(x, _cache(1))
    xla = tf.function(step.python_function, input_signature=step.input_signature, jit_compile=True)
    try:  # XLA refuses the write of 2 rows into 1 at compile time, or the outputs are NaN
        output, _ = xla(x, _cache(1))
    except tf.errors.InvalidArgumentError as error:
        assert "dynamic slice" in str(error)
    else:
        assert np.isnan(output.numpy()).all()


def test_in_onnx_a_cache_of_another_batch_gives_nan(tmp_path):
    import keras

    from keras_posenc import export as kpe
    from keras_posenc.export.verify.runtimes import onnx_session

    tokens = keras.Input((None, WIDTH), name="tokens")
    cache = keras.Input((2, MAX_LENGTH, 2, HEAD_DIM), name="cache")
    index = keras.Input(batch_shape=(), dtype="int32", name="index")
    output, new_cache = _layer()(tokens, tokens, cache=cache, cache_update_index=index)
    model = keras.Model([tokens, cache, index], {"output": output, "new_cache": new_cache})
    path = kpe.save_onnx(model, tmp_path / "step.onnx")
    session = onnx_session(path)
    feeds = {"tokens": _tokens(batch=2), "cache": _cache(1), "index": np.array(0, np.int32)}
    (output,) = session.run(["output"], feeds)
    assert np.isnan(output).all()
    same = {**feeds, "cache": _cache(2)}
    assert np.isfinite(session.run(["output"], same)[0]).all()

    # The verifier gives a decode step cache slots its tokens fit, not position probes
    # (which its graph assertion refused), and lengths up to the cache's.
    report = kpe.verify_export(
        model, onnx_path=path, batch_sizes=(1, 2), sequence_lengths=(1, 2), repeats=1
    )
    assert report["passed"]
    assert {case["sequence"] for case in report["cases"]} == {1, 2, MAX_LENGTH}


def test_a_cache_mask_of_another_batch_is_an_error_naming_it():
    x = _tokens(batch=2)
    layer = RotaryGroupQueryAttention(HEAD_DIM, 4, 2, positions_from_mask=True)
    with pytest.raises(ValueError, match=r"cache_mask has batch 3 but the cache 2"):
        layer(x, x, cache=_cache(2), cache_update_index=0, cache_mask=np.ones((3, MAX_LENGTH)))


def test_an_attention_mask_of_the_wrong_shape_is_an_error_naming_it():
    x = _tokens(batch=1, steps=2)
    with pytest.raises(ValueError, match=r"attention_mask with a cache must be \(batch, 2, 6\)"):
        _layer()(x, x, cache=_cache(), cache_update_index=0, attention_mask=np.ones((1, 2, 2)))


@pytest.mark.parametrize(
    "make",
    [
        lambda: RotaryGroupQueryAttention(HEAD_DIM, 0, 1),
        lambda: RotaryGroupQueryAttention(HEAD_DIM, 4, 0),
        lambda: RotaryMultiHeadAttention(0, HEAD_DIM),
    ],
    ids=["query-heads", "kv-heads", "mha-heads"],
)
def test_zero_heads_are_an_error_naming_the_argument(make):
    with pytest.raises(ValueError, match=r"(num_query_heads|num_key_value_heads|num_heads)=0"):
        make()


def test_in_a_graph_a_cache_mask_of_another_batch_fails_or_is_nan_never_broadcast():
    # Eagerly refused (above); with the batch unknown while tracing, a batch-1 cache_mask
    # used to be broadcast over every row: row 0's padding for all.
    layer = _layer()
    signature = [
        tf.TensorSpec([None, None, WIDTH]),
        tf.TensorSpec([None, 2, MAX_LENGTH, 2, HEAD_DIM]),
        tf.TensorSpec([None, MAX_LENGTH]),
    ]

    def step(x, cache, cache_mask):
        return layer(x, x, cache=cache, cache_update_index=0, cache_mask=cache_mask)[0]

    x, mask = _tokens(batch=2, steps=2), np.ones((1, MAX_LENGTH), np.float32)
    graph = tf.function(step, input_signature=signature)
    with pytest.raises(
        tf.errors.InvalidArgumentError, match="cache_mask has a batch other than the cache"
    ):
        graph(x, _cache(2), mask)
    assert np.isfinite(graph(x, _cache(2), np.ones((2, MAX_LENGTH), np.float32))).all()
    xla = tf.function(step, input_signature=signature, jit_compile=True)
    assert np.isnan(xla(x, _cache(2), mask).numpy()).all()


def test_in_a_graph_an_attention_mask_of_other_steps_fails_never_broadcast():
    # Eagerly refused (above); with the sizes unknown while tracing, a (batch, 1, max_length)
    # mask used to be broadcast over the queries.
    layer = _layer()
    graph = tf.function(
        lambda x, mask: layer(x, x, cache=_cache(2), cache_update_index=0, attention_mask=mask)[0],
        input_signature=[tf.TensorSpec([None, None, WIDTH]), tf.TensorSpec([None, None, None])],
    )
    x = _tokens(batch=2, steps=2)
    with pytest.raises(tf.errors.InvalidArgumentError, match="attention_mask with a cache must"):
        graph(x, np.ones((2, 1, MAX_LENGTH), np.float32))
    assert np.isfinite(graph(x, np.ones((2, 2, MAX_LENGTH), np.float32))).all()
