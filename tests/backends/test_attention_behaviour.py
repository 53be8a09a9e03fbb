"""The attention layers on JAX / torch beyond their values: bad input, training, files.

Bad input raises TensorFlow's errors where its value is known (eagerly; under `jax.jit`
also every shape, which JAX keeps static) and makes the outputs NaN where `jax.jit`
traces it, as XLA does in TensorFlow: an update index past the cache, bad positions.
The layers train inside a Keras model (`fit`: compiled by JAX, eager on torch), dropout
included, and round-trip through a `.keras` file.
"""

from __future__ import annotations

import attention_cases as ac
import keras
import numpy as np
import pytest

import keras_posenc as kp

BACKEND = keras.backend.backend()
MAX_LENGTH = 12
X = np.random.default_rng(0).standard_normal((2, 2, 32)).astype(np.float32)


def _layer():
    layer = kp.RotaryGroupQueryAttention(
        8, 4, 2, positions_from_mask=True, **ac.ZEROS, name="attention"
    )
    layer.build(X.shape, X.shape)
    ac.set_weights(layer)
    return layer


def _cache(batch: int = 2, kv_heads: int = 2, dtype="float32"):
    return np.zeros((batch, 2, MAX_LENGTH, kv_heads, 8), dtype)


@pytest.mark.parametrize(
    "call, error, message",
    [
        ({"cache_update_index": 11}, ValueError, r"cache_update_index=11 with 2 new tokens"),
        ({"cache_update_index": -1}, ValueError, r"must be in \[0, 10\]"),
        ({"cache_update_index": 1.0}, TypeError, "must be an integer"),
        ({"cache_update_index": np.array([1])}, TypeError, "must be a scalar"),
        ({"cache": _cache(batch=1)}, ValueError, "cache has batch 1 but the queries 2"),
        ({"cache_mask": np.ones((3, MAX_LENGTH))}, ValueError, "cache_mask has batch 3"),
        ({"cache": _cache(kv_heads=3)}, ValueError, r"= \(batch, 2, max_length, 2, 8\)"),
        ({"cache": _cache(dtype="int32")}, TypeError, "floating-point keys and values"),
        ({"query_positions": np.array([0, -1])}, ValueError, "positions must be >= 0"),
        ({"attention_mask": np.ones((2, 3, MAX_LENGTH))}, ValueError, r"\(batch, 2, 12\)"),
        ({"return_attention_scores": True}, ValueError, "not supported with a cache"),
        ({"value_mask": np.ones((2, 2))}, ValueError, "give their padding as cache_mask"),
        ({"query_start_index": 3}, ValueError, "not start indices"),
    ],
)
def test_bad_cached_calls_raise_eagerly(call, error, message):
    arguments = {"cache": _cache(), "cache_update_index": 0, **call}
    with pytest.raises(error, match=message):
        _layer()(X, X, use_causal_mask=True, **arguments)


def test_bad_calls_without_a_cache_raise_eagerly():
    layer = _layer()
    with pytest.raises(ValueError, match="need a `cache`"):
        layer(X, X, cache_update_index=0)
    with pytest.raises(ValueError, match="start_index must be >= 0"):
        layer(X, X, query_start_index=-1)
    with pytest.raises(ValueError, match="positions must be below"):
        layer(X, X, query_positions=np.array([0, 2**24]))


@pytest.mark.skipif(BACKEND != "jax", reason="jax.jit")
@pytest.mark.parametrize(
    "argument, value",
    [
        ("cache_update_index", 11),  # 2 new tokens: past the 12 slots
        ("cache_update_index", -1),
        ("cache_update_index", 2**31 - 1),
        ("query_positions", np.array([[0, 1], [2, -1]], np.int32)),
        ("query_positions", np.array([[0, 1], [2, 2**24]], np.int32)),
    ],
)
def test_bad_traced_values_give_nan_under_jit(argument, value):
    import jax

    layer = _layer()

    def step(x, cache, traced):
        arguments = {"cache_update_index": 0, **traced}
        return layer(x, x, use_causal_mask=True, cache=cache, **arguments)

    good = {"cache_update_index": 3, "query_positions": np.array([[3, 4], [3, 4]], np.int32)}
    good = {argument: good[argument]}  # of the bad one's type and shape: one compilation
    jitted = jax.jit(step)
    output, _ = jitted(X, _cache(), good)
    assert np.all(np.isfinite(np.asarray(output)))
    output, _ = jitted(X, _cache(), {argument: value})
    assert np.all(np.isnan(np.asarray(output)))


@pytest.mark.skipif(BACKEND != "jax", reason="jax.jit")
def test_a_bad_start_without_a_cache_gives_nan_under_jit():
    import jax

    layer = _layer()
    output = jax.jit(lambda x, start: layer(x, x, query_start_index=start, key_start_index=0))(
        X, -1
    )
    assert np.all(np.isnan(np.asarray(output)))


@pytest.mark.skipif(BACKEND != "jax", reason="jax.jit")
def test_shapes_are_static_under_jit_so_a_batch_mismatch_raises():
    import jax

    layer = _layer()
    step = jax.jit(
        lambda x, cache, mask, index: layer(
            x, x, cache=cache, cache_mask=mask, cache_update_index=index
        )
    )
    with pytest.raises(ValueError, match="cache_mask has batch 1 but the cache 2"):
        step(X, _cache(), np.ones((1, MAX_LENGTH), np.int32), 0)


def test_attention_temperature_is_llama4s_formula():
    positions = np.array([0, 8190, 8191, 20000, 2**31 - 2], np.int32)
    scale = keras.ops.convert_to_numpy(kp.AttentionTemperature(8192, 0.1)(positions))
    expected = np.log1p(np.floor((positions.astype(np.float64) + 1) / 8192)) * 0.1 + 1
    assert scale.dtype == np.float32
    np.testing.assert_allclose(scale, expected, rtol=2**-23)
    with pytest.raises(TypeError, match="positions must be integers"):
        kp.AttentionTemperature()(np.zeros(2, np.float32))


def test_dropout_applies_in_training_only():
    layer = kp.RotaryMultiHeadAttention(4, 8, dropout=0.5, **ac.ZEROS)  # attention_cases' shapes
    x = X.repeat(4, axis=1)
    layer.build(x.shape, x.shape)
    ac.set_weights(layer)
    inference = keras.ops.convert_to_numpy(layer(x, x, training=False))
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(layer(x, x)), inference)
    trained, scores = layer(x, x, training=True, return_attention_scores=True)
    trained = keras.ops.convert_to_numpy(trained)
    assert np.all(np.isfinite(trained)) and not np.allclose(trained, inference)
    # Rows of a softmax `e_i / Σ e_j` (whatever the exps' own errors: they cancel): the
    # denominator's sum `γ_{S-1}`, a division or reciprocal and product `2u`, and numpy's
    # float32 sum of the row `γ_{S-1}` again.
    from float32_error import U, assert_within_bound, gamma

    keys = x.shape[1]
    row = (2 * U + gamma(keys - 1)) / (1 - gamma(keys - 1))
    bound = row + gamma(keys - 1) * (1 + row)
    assert_within_bound(keras.ops.convert_to_numpy(scores).sum(-1), 1.0, bound, what="rows")


def _model() -> keras.Model:
    """Token ids -> embedding -> multi-head attention (dropout, gate) -> decoder block
    (grouped-query attention with q/k norm) -> logits of the next token; weights from
    `attention_cases.set_weights` (a random initializer compiles per shape on JAX)."""
    ids = keras.Input((8,), dtype="int32")
    x = keras.layers.Embedding(16, 32, embeddings_initializer="zeros")(ids)
    attended = kp.RotaryMultiHeadAttention(4, 8, dropout=0.1, use_gate=True, **ac.ZEROS)(
        x, x, use_causal_mask=True
    )
    block = kp.DecoderBlock(8, 4, 2, 64, query_key_norm="rms_per_head", kernel_initializer="zeros")
    x = block(x + attended)
    model = keras.Model(ids, keras.layers.Dense(16, kernel_initializer="zeros")(x))
    ac.set_weights(model)
    return model


def test_the_attention_layers_train_and_round_trip_through_a_keras_file(tmp_path):
    keras.utils.set_random_seed(1)
    model = _model()
    model.compile(
        optimizer=keras.optimizers.Adam(1e-2),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 16, (16, 9)).astype(np.int32)
    history = model.fit(ids[:, :-1], ids[:, 1:], batch_size=8, epochs=5, verbose=0)
    losses = history.history["loss"]
    assert np.all(np.isfinite(losses)) and losses[-1] < losses[0], losses
    model.save(tmp_path / "model.keras")
    loaded = keras.saving.load_model(tmp_path / "model.keras")
    for saved, restored in zip(model.weights, loaded.weights, strict=True):
        np.testing.assert_array_equal(saved.numpy(), restored.numpy())
    # (predict: compiled once by JAX, where an eager call compiles each op of the model)
    np.testing.assert_allclose(
        loaded.predict(ids[:2, :-1], verbose=0),
        model.predict(ids[:2, :-1], verbose=0),
        rtol=1e-6,
        atol=1e-6,
    )
