"""The attention layers with multi-axis RoPE: axial (`rope_axes_dims`) and M-RoPE
(`rope_mrope_section`, chunked and interleaved), positions `(batch, sequence, axes)`.

The float64 references restate the angles of FLUX's EmbedND and of Qwen2-VL / Qwen3-VL
independently of the package (as tests/test_axes_export.py does); the rotation and the
attention are `reference.multi_head_attention` with float32 error bounds. The cache is
also compared with `RotaryEmbedding` applied by hand to the projected keys.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
import reference
import tensorflow as tf
from float32_error import (
    Bounded,
    assert_within,
    assert_within_bound,
    linear_error,
    rotation_error,
    table,
)

from keras_posenc import RotaryEmbedding, RotaryGroupQueryAttention, RotaryMultiHeadAttention
from keras_posenc import export as kpe

HEAD_DIM, QUERY_HEADS, WIDTH, MAX_LENGTH = 8, 4, 12, 8
SECTION = (2, 1, 1)
ROPES = {
    "axial": ({"rope_axes_dims": (4, 4)}, 2),
    "mrope": ({"rope_mrope_section": SECTION}, 3),
    "mrope_interleaved": ({"rope_mrope_section": SECTION, "rope_mrope_interleaved": True}, 3),
}
LAYERS = {
    "gqa": lambda **rope: RotaryGroupQueryAttention(HEAD_DIM, QUERY_HEADS, 2, **rope),
    "mha": lambda **rope: RotaryMultiHeadAttention(QUERY_HEADS, HEAD_DIM, **rope),
}


def _angles(name: str, positions: np.ndarray) -> np.ndarray:
    """float64 angles `(batch, sequence, HEAD_DIM / 2)` of coordinates `(batch, sequence, axes)`."""
    positions = positions.astype(np.float64)
    if name == "axial":  # FLUX's EmbedND: each axis its own frequencies, in axis order
        parts = []
        for axis, dim in enumerate((4, 4)):
            omega = 1.0 / 10000.0 ** (np.arange(0, dim, 2, dtype=np.float64) / dim)
            parts.append(positions[..., axis, None] * omega)
        return np.concatenate(parts, -1)
    omega = 1.0 / 10000.0 ** (np.arange(0, HEAD_DIM, 2, dtype=np.float64) / HEAD_DIM)
    freqs = np.moveaxis(positions, -1, 0)[..., None] * omega  # (axes, batch, sequence, pairs)
    if name == "mrope":  # Qwen2-VL: chunk i of the section from axis i
        chunks = np.split(freqs, np.cumsum(SECTION)[:-1], axis=-1)
        return np.concatenate([chunk[i] for i, chunk in enumerate(chunks)], -1)
    result = freqs[0].copy()  # Qwen3-VL: pairs 1, 4, ... height, 2, 5, ... width
    for axis in (1, 2):
        index = slice(axis, SECTION[axis] * 3, 3)
        result[..., index] = freqs[axis, ..., index]
    return result


def _rotated(x: Bounded, theta: np.ndarray) -> Bounded:
    """Half-layout rotation of `(batch, steps, heads, HEAD_DIM)` heads by `theta`."""
    sin, cos = table(np.sin(theta)[:, :, None]), table(np.cos(theta)[:, :, None])
    half = HEAD_DIM // 2
    a, b = x[..., :half], x[..., half:]
    return np.concatenate([a * cos - b * sin, b * cos + a * sin], axis=-1)


def _weights(layer) -> dict:
    query_heads, kv_heads = layer._head_counts()[:2]
    groups = query_heads // kv_heads
    parts = [layer._query_dense, layer._key_dense, layer._value_dense, layer._output_dense]
    weights = {}
    for name, dense in zip(("query", "key", "value", "output"), parts, strict=True):
        kernel = dense.kernel.numpy().astype(np.float64)
        bias = dense.bias.numpy().astype(np.float64)
        if name in ("key", "value"):
            kernel, bias = np.repeat(kernel, groups, axis=1), np.repeat(bias, groups, axis=0)
        weights[name + "_kernel"], weights[name + "_bias"] = kernel, bias
    return weights


def _expected(name, layer, query, value, query_positions, key_positions, mask=None):
    theta = {"query": _angles(name, query_positions), "key": _angles(name, key_positions)}
    return reference.multi_head_attention(
        query,
        value,
        _weights(layer),
        rotate=lambda projected, which: _rotated(projected, theta[which]),
        attention_mask=mask,
    )[0]


def _normal(shape, seed):
    return np.random.default_rng(seed).normal(size=shape).astype(np.float32)


def _coordinates(shape, seed, high=5000):
    return np.random.default_rng(seed).integers(0, high, size=shape).astype(np.int32)


def _layer(kind: str, rope: str):
    layer = LAYERS[kind](**ROPES[rope][0])
    zeros = np.zeros((2, ROPES[rope][1]), np.int32)
    layer(
        tf.zeros((1, 2, WIDTH)), tf.zeros((1, 2, WIDTH)), query_positions=zeros, key_positions=zeros
    )
    rng = np.random.default_rng(0)
    layer.set_weights([rng.normal(0, 0.4, w.shape).astype(np.float32) for w in layer.weights])
    return layer


@pytest.mark.parametrize("kind", list(LAYERS))
@pytest.mark.parametrize("rope", list(ROPES))
def test_multi_axis_attention_matches_the_reference(kind, rope):
    layer, axes = _layer(kind, rope), ROPES[rope][1]
    query, value = _normal((2, 5, WIDTH), 1), _normal((2, 6, WIDTH), 2)
    query_positions, key_positions = _coordinates((2, 5, axes), 3), _coordinates((2, 6, axes), 4)
    got = layer(query, value, query_positions=query_positions, key_positions=key_positions)
    expected = _expected(rope, layer, query, value, query_positions, key_positions)
    assert_within(got, expected)
    # (sequence, axes) positions: one grid for every row.
    shared = np.broadcast_to(key_positions[:1], key_positions.shape)
    got = layer(value, value, query_positions=key_positions[0], key_positions=key_positions[0])
    assert_within(got, _expected(rope, layer, value, value, shared, shared))


@pytest.mark.parametrize("kind", list(LAYERS))
@pytest.mark.parametrize("rope", list(ROPES))
def test_multi_axis_cache_decodes_as_the_full_pass(kind, rope):
    # A prefill of 4 tokens, then two decode steps given their new tokens' coordinates: each
    # output row is the causal full pass's, and the cache holds the keys RotaryEmbedding
    # rotates by hand.
    layer, axes = _layer(kind, rope), ROPES[rope][1]
    x, positions = _normal((2, 6, WIDTH), 5), _coordinates((2, 6, axes), 6)
    causal = np.broadcast_to(np.tri(6, dtype=bool), (2, 6, 6))
    expected = _expected(rope, layer, x, x, positions, positions, causal)
    kv_heads = layer._head_counts()[1]
    cache = np.zeros((2, 2, MAX_LENGTH, kv_heads, HEAD_DIM), np.float32)
    step = tf.function(
        lambda x, cache, index, positions: layer(
            x,
            x,
            use_causal_mask=True,
            cache=cache,
            cache_update_index=index,
            query_positions=positions,
        )
    )
    outputs = []
    for start, stop in ((0, 4), (4, 5), (5, 6)):
        output, cache = step(x[:, start:stop], cache, tf.constant(start), positions[:, start:stop])
        outputs.append(output.numpy())
    assert_within(np.concatenate(outputs, 1), expected)
    by_hand = RotaryEmbedding(**{k[len("rope_") :]: v for k, v in ROPES[rope][0].items()})
    keys = by_hand(layer._key_dense(x), positions=positions)
    # The cache's keys (projected in a trace, 4 rows then 1) and these (eager, 6 rows): each
    # a float32 Dense (`linear_error`), then RoPE of it (`rotation_error` of the rounded
    # keys, and each output of a pair carries at most twice the head's largest input error).
    kernel, bias = (np.asarray(w, np.float64) for w in layer._key_dense.weights)
    projected = np.einsum("btw,whd->bthd", x, kernel) + bias
    error = linear_error(x, kernel.reshape(WIDTH, -1), bias.ravel()).reshape(projected.shape)
    bound = rotation_error(np.abs(projected) + error) + 2 * error.max(-1, keepdims=True)
    assert_within_bound(cache.numpy()[:, 0, :6], np.asarray(keys), 2 * bound, what="cached keys")
    assert not cache.numpy()[:, :, 6:].any()


def test_padded_text_under_mrope_is_plain_rope_with_positions_from_mask():
    # Text tokens sit at the same coordinate on every axis: M-RoPE then is 1D RoPE, for
    # positions from the query mask and, with a cache, from cache_mask.
    mrope = RotaryGroupQueryAttention(
        HEAD_DIM, QUERY_HEADS, 2, rope_mrope_section=SECTION, positions_from_mask=True
    )
    plain = RotaryGroupQueryAttention(HEAD_DIM, QUERY_HEADS, 2, positions_from_mask=True)
    x = _normal((2, 5, WIDTH), 7)
    mask = np.array([[False, False, True, True, True], [True] * 5])
    mrope(x, x)
    plain(x, x)
    plain.set_weights(mrope.get_weights())
    # Equal coordinates give M-RoPE the 1D tables' own rows: the same float32 numbers.
    np.testing.assert_array_equal(
        mrope(x, x, query_mask=mask, use_causal_mask=True),
        plain(x, x, query_mask=mask, use_causal_mask=True),
    )
    cache = np.zeros((2, 2, MAX_LENGTH, 2, HEAD_DIM), np.float32)
    cache_mask = np.concatenate([mask, np.ones((2, MAX_LENGTH - 5), bool)], 1)
    call = {"use_causal_mask": True, "cache_update_index": 0, "cache_mask": cache_mask}
    (got, got_cache), (want, want_cache) = (
        layer(x, x, cache=cache, **call) for layer in (mrope, plain)
    )
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(got_cache, want_cache)


def test_axial_rope_with_a_cache_and_no_positions_is_an_error_naming_them():
    layer = RotaryGroupQueryAttention(HEAD_DIM, QUERY_HEADS, 2, rope_axes_dims=(4, 4))
    x = _normal((1, 2, WIDTH), 8)
    cache = np.zeros((1, 2, MAX_LENGTH, 2, HEAD_DIM), np.float32)
    with pytest.raises(ValueError, match=r"Axial RoPE needs positions of shape \(sequence, 2\)"):
        layer(x, x, cache=cache, cache_update_index=0)


def test_config_round_trips_the_multi_axis_options():
    for kind in LAYERS:
        options = {"rope_mrope_section": SECTION, "rope_mrope_interleaved": True}
        config = LAYERS[kind](**options).get_config()
        assert config["rope_mrope_section"] == SECTION and config["rope_mrope_interleaved"]
        clone = type(LAYERS[kind]()).from_config(config)
        assert clone.get_config() == config
        assert clone.rotary_embedding.mrope_section == SECTION


@pytest.mark.parametrize(
    ("rope", "cached"), [("axial", True), ("mrope_interleaved", True), ("mrope", False)]
)
def test_multi_axis_attention_exports_to_onnx_and_verifies(tmp_path, rope, cached):
    axes = ROPES[rope][1]
    tokens = keras.Input((None, WIDTH), name="tokens")
    positions = keras.Input((None, axes), dtype="int32", name="positions")
    layer = LAYERS["gqa"](**ROPES[rope][0])
    call = {"use_causal_mask": True, "query_positions": positions}
    if cached:
        cache = keras.Input((2, MAX_LENGTH, 2, HEAD_DIM), name="cache")
        index = keras.Input(batch_shape=(), dtype="int32", name="index")
        output, new_cache = layer(tokens, tokens, cache=cache, cache_update_index=index, **call)
        inputs, outputs = [tokens, positions, cache, index], [output, new_cache]
    else:
        inputs, outputs = [tokens, positions], [layer(tokens, tokens, **call)]
    model = keras.Model(inputs, outputs)
    path = kpe.save_onnx(model, tmp_path / "attention.onnx")
    report = kpe.verify_export(
        model, onnx_path=path, batch_sizes=(1, 2), sequence_lengths=(1, 3), repeats=1
    )
    assert report["passed"]
    assert report["summary"]["onnxruntime"]["max_abs_error"] <= 1e-5
    per_axis = report["positions"]["covered_per_axis"]["positions"]
    assert len(per_axis) == axes
    if not cached:  # (with a cache the verifier keeps positions within max_length)
        assert all(max(last for _, last in runs) >= 2**24 - 1 for runs in per_axis)


@pytest.mark.parametrize(("model_type", "interleaved"), [("qwen2_vl", False), ("qwen3_vl", True)])
def test_a_multimodal_config_gives_attention_with_its_mrope(model_type, interleaved):
    config = {
        "model_type": model_type,
        "hidden_size": 64,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "rope_scaling": {"rope_type": "default", "mrope_section": [4, 2, 2]},
    }
    if model_type == "qwen3_vl":
        config = {
            "model_type": model_type,
            # Qwen3-VL's text config has its own head_dim (default 128), not width / heads.
            "text_config": {**config, "model_type": "qwen3_vl_text", "head_dim": 16},
        }
    layer = RotaryGroupQueryAttention.from_transformers_config(config)
    rope = layer.rotary_embedding
    assert (rope.mrope_section, rope.mrope_interleaved) == ((4, 2, 2), interleaved)
