"""`RotaryGroupQueryAttention` against grouped-query attention written by hand in float64.

Grouped-query attention is multi-head attention whose query head `h` reads key/value
head `h // (num_query_heads // num_key_value_heads)`: the reference repeats the key and
value kernels that way and runs `reference.multi_head_attention`.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
import reference
import tensorflow as tf
from float32_error import assert_agree, assert_within

from keras_posenc import RotaryGroupQueryAttention, RotaryMultiHeadAttention

HEAD_DIM, QUERY_HEADS, WIDTH = 8, 4, 12


def _randomised(layer, seed=0):
    rng = np.random.default_rng(seed)
    layer.set_weights([rng.normal(0, 0.4, w.shape).astype(np.float32) for w in layer.weights])
    return layer


def _weights(layer) -> dict:
    groups = layer.num_query_heads // layer.num_key_value_heads
    weights = {}
    for name, dense in [
        ("query", layer._query_dense),
        ("key", layer._key_dense),
        ("value", layer._value_dense),
        ("output", layer._output_dense),
    ]:
        kernel = dense.kernel.numpy().astype(np.float64)
        bias = None if dense.bias is None else dense.bias.numpy().astype(np.float64)
        if name in ("key", "value"):
            kernel = np.repeat(kernel, groups, axis=1)
            bias = None if bias is None else np.repeat(bias, groups, axis=0)
        weights[name + "_kernel"] = kernel
        if bias is not None:
            weights[name + "_bias"] = bias
    return weights


def _expected(layer, query, value, query_positions, key_positions, **options):
    rope = layer.rotary_embedding
    positions = {"query": query_positions, "key": key_positions}

    def rotate(projected, which):
        return reference.rotary(
            projected,
            positions[which],
            max_wavelength=rope.max_wavelength,
            layout=rope.layout,
            rotary_dim=rope.rotary_dim,
        )

    return reference.multi_head_attention(query, value, _weights(layer), rotate=rotate, **options)


def _normal(shape, seed):
    return np.random.default_rng(seed).normal(size=shape).astype(np.float32)


@pytest.mark.parametrize(
    "kv_heads, options",
    [
        (2, {}),
        (1, {"rope_layout": "interleaved"}),
        (2, {"rope_dim": 4, "rope_max_wavelength": 500000.0, "use_bias": False}),
        (4, {"rope_layout": "interleaved"}),
    ],
    ids=["gqa", "mqa-interleaved", "partial-no-bias", "mha"],
)
def test_matches_the_reference(in_mode, kv_heads, options):
    layer = RotaryGroupQueryAttention(HEAD_DIM, QUERY_HEADS, kv_heads, **options)
    layer(tf.zeros((1, 2, WIDTH)), tf.zeros((1, 3, WIDTH)))
    _randomised(layer)
    attend = in_mode(
        lambda q, v, s, p: (
            layer(q, v, query_start_index=s, key_positions=p),
            layer(q, v, use_causal_mask=True, return_attention_scores=True),
        ),
        [
            tf.TensorSpec([None, None, WIDTH]),
            tf.TensorSpec([None, None, WIDTH]),
            tf.TensorSpec([], tf.int32),
            tf.TensorSpec([None, None], tf.int32),
        ],
    )
    query, value = _normal((2, 6, WIDTH), 1), _normal((2, 6, WIDTH), 2)
    key_positions = np.array([[0, 1, 2, 3, 4, 5], [9, 4000, 4100, 2, 70000, 6]], np.int32)
    (shifted, (causal, scores)) = attend(query, value, tf.constant(4090), key_positions)
    expected, _ = _expected(layer, query, value, np.arange(4090, 4096), key_positions)
    assert_within(shifted, expected)
    mask = np.broadcast_to(np.tri(6, dtype=bool), (2, 6, 6))
    expected, expected_scores = _expected(
        layer, query, value, np.arange(6), np.arange(6), attention_mask=mask
    )
    assert_within(causal, expected)
    assert_within(scores, expected_scores)


def test_equal_head_counts_are_rotary_multi_head_attention():
    gqa = RotaryGroupQueryAttention(HEAD_DIM, QUERY_HEADS, QUERY_HEADS, rope_layout="interleaved")
    mha = RotaryMultiHeadAttention(QUERY_HEADS, HEAD_DIM, rope_layout="interleaved")
    x = _normal((2, 7, WIDTH), 3)
    gqa(x, x)
    mha(x, x)
    _randomised(gqa)
    mha.set_weights(gqa.get_weights())
    causal = np.broadcast_to(np.tri(7, dtype=bool), (2, 7, 7))
    for kwargs, positions, mask in (
        ({"use_causal_mask": True}, np.arange(7), causal),
        ({"query_start_index": 300}, np.arange(300, 307), None),
    ):
        expected, _ = _expected(gqa, x, x, positions, np.arange(7), attention_mask=mask)
        assert_within(gqa(x, x, **kwargs), expected)
        assert_agree(gqa(x, x, **kwargs), mha(x, x, **kwargs), expected)


def test_the_weights_are_exactly_group_query_attentions():
    x = _normal((2, 5, WIDTH), 4)
    rotary = RotaryGroupQueryAttention(HEAD_DIM, QUERY_HEADS, 2, use_gate=True)
    plain = keras.layers.GroupQueryAttention(HEAD_DIM, QUERY_HEADS, 2, use_gate=True)
    rotary(x, x)
    plain(x, x)
    assert [w.shape for w in rotary.weights] == [w.shape for w in plain.weights]
    assert [w.path.split("/", 1)[1] for w in rotary.weights] == [
        w.path.split("/", 1)[1] for w in plain.weights
    ]
    _randomised(rotary)
    plain.set_weights(rotary.get_weights())
    # No rotation (cos 1, sin 0: exact in float32): the plain layer's operations, gate included,
    # eagerly in the same order; any difference is a different computation, not rounding.
    zeros = np.zeros(5, np.int32)
    np.testing.assert_array_equal(
        rotary(x, x, query_positions=zeros, key_positions=zeros), plain(x, x)
    )


def test_left_padded_rows_attend_as_unpadded_with_positions_from_mask():
    layer = RotaryGroupQueryAttention(HEAD_DIM, QUERY_HEADS, 2, positions_from_mask=True)
    tokens = _normal((1, 5, WIDTH), 5)
    padded = np.concatenate([_normal((1, 3, WIDTH), 6), tokens], axis=1)
    mask = np.array([[False] * 3 + [True] * 5])
    alone = layer(tokens, tokens, use_causal_mask=True)
    _randomised(layer)
    alone = layer(tokens, tokens, use_causal_mask=True).numpy()
    got = layer(padded, padded, query_mask=mask, value_mask=mask, use_causal_mask=True)
    causal = np.tri(5, dtype=bool)[None]
    expected, _ = _expected(
        layer, tokens, tokens, np.arange(5), np.arange(5), attention_mask=causal
    )
    assert_within(alone, expected)
    assert_agree(got.numpy()[:, 3:], alone, expected)


def test_config_and_keras_file_round_trip(tmp_path):
    scaling = {"rope_type": "linear", "factor": 2.0}
    layer = RotaryGroupQueryAttention(
        HEAD_DIM,
        QUERY_HEADS,
        2,
        rope_max_wavelength=500.0,
        rope_layout="interleaved",
        rope_dim=4,
        rope_scaling=scaling,
        positions_from_mask=True,
        name="attention",
    )
    config = layer.get_config()
    assert RotaryGroupQueryAttention.from_config(config).get_config() == config
    inputs = keras.Input((None, WIDTH))
    model = keras.Model(inputs, layer(inputs, inputs, use_causal_mask=True))
    _randomised(layer)
    path = tmp_path / "gqa.keras"
    model.save(path)
    loaded = keras.models.load_model(path)
    x = _normal((2, 6, WIDTH), 7)
    np.testing.assert_array_equal(loaded(x), model(x))
    assert loaded.get_layer("attention").get_config() == config


def test_a_cached_call_in_the_functional_api_returns_output_and_cache():
    tokens = keras.Input((None, WIDTH))
    cache = keras.Input((2, 10, 2, HEAD_DIM))
    index = keras.Input((), dtype="int32", batch_size=1)
    layer = RotaryGroupQueryAttention(HEAD_DIM, QUERY_HEADS, 2)
    output, new_cache = layer(
        tokens, tokens, use_causal_mask=True, cache=cache, cache_update_index=index[0]
    )
    assert tuple(output.shape) == (None, None, WIDTH)
    assert tuple(new_cache.shape) == (None, 2, 10, 2, HEAD_DIM)
    model = keras.Model([tokens, cache, index], [output, new_cache])
    x = _normal((1, 4, WIDTH), 8)
    empty = np.zeros((1, 2, 10, 2, HEAD_DIM), np.float32)
    got, filled = model([x, empty, np.array([0], np.int32)])
    causal = np.tri(4, dtype=bool)[None]
    expected, _ = _expected(layer, x, x, np.arange(4), np.arange(4), attention_mask=causal)
    assert_within(got, expected)
    assert np.abs(filled.numpy()[:, :, :4]).min() > 0 and not filled.numpy()[:, :, 4:].any()


def test_an_attention_mask_of_another_batch_is_an_error_naming_it():
    layer = RotaryGroupQueryAttention(HEAD_DIM, QUERY_HEADS, 2)
    x = np.zeros((2, 2, WIDTH), np.float32)
    cache = np.zeros((2, 2, 6, 2, HEAD_DIM), np.float32)
    with pytest.raises(ValueError, match=r"attention_mask has batch 3 but the queries 2"):
        layer(x, x, cache=cache, cache_update_index=0, attention_mask=np.ones((3, 2, 6)))


def test_in_onnx_an_attention_mask_of_other_steps_gives_nan(tmp_path):
    # The converters drop the assertion, and a boolean mask cannot carry NaN: the mask's
    # validity goes into the NaN selection of the new queries, keys and values.
    import onnxruntime

    from keras_posenc import export as kpe

    tokens = keras.Input((None, WIDTH), name="tokens")
    cache = keras.Input((2, 6, 2, HEAD_DIM), name="cache")
    mask = keras.Input((None, 6), name="attention_mask")
    layer = RotaryGroupQueryAttention(HEAD_DIM, QUERY_HEADS, 2)
    output, _ = layer(tokens, tokens, cache=cache, cache_update_index=0, attention_mask=mask)
    path = kpe.save_onnx(keras.Model([tokens, cache, mask], output), tmp_path / "step.onnx")
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])

    def run(mask_shape):
        feeds = {
            "tokens": np.ones((2, 2, WIDTH), np.float32),
            "cache": np.zeros((2, 2, 6, 2, HEAD_DIM), np.float32),
            "attention_mask": np.ones(mask_shape, np.float32),
        }
        return session.run(None, feeds)[0]

    assert np.isfinite(run((2, 2, 6))).all()
    assert np.isnan(run((2, 1, 6))).all()  # 1 step, not 2
    np.testing.assert_array_equal(run((1, 2, 6)), run((2, 2, 6)))  # one mask for every row
