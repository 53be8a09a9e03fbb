"""`RotaryMultiHeadAttention` against multi-head attention written by hand in float64."""

from __future__ import annotations

import threading

import keras
import numpy as np
import pytest
import reference
import tensorflow as tf
from float32_error import assert_agree, assert_within

from keras_posenc import RotaryMultiHeadAttention

HEADS, KEY_DIM, WIDTH = 2, 8, 12


def _weights(layer) -> dict:
    """The layer's projections as the float64 arrays `reference.multi_head_attention` takes."""
    weights = {}
    for name, dense in [
        ("query", layer.query_dense),
        ("key", layer.key_dense),
        ("value", layer.value_dense),
        ("output", layer.output_dense),
    ]:
        weights[name + "_kernel"] = keras.ops.convert_to_numpy(dense.kernel).astype(np.float64)
        if dense.bias is not None:
            weights[name + "_bias"] = keras.ops.convert_to_numpy(dense.bias).astype(np.float64)
    return weights


def _expected(layer, query, value, *, key=None, query_positions, key_positions, **options):
    """The float64 reference with the layer's weights and rotation settings."""
    rotation = {
        "max_wavelength": layer.rotary_embedding.max_wavelength,
        "layout": layer.rotary_embedding.layout,
        "rotary_dim": layer.rotary_embedding.rotary_dim,
    }
    positions = {"query": query_positions, "key": key_positions}

    def rotate(projected, which):
        return reference.rotary(projected, positions[which], **rotation)

    return reference.multi_head_attention(
        query, value, _weights(layer), key=key, rotate=rotate, **options
    )


def _normal(shape, seed):
    return np.random.default_rng(seed).normal(size=shape).astype(np.float32)


def _causal(query_length, key_length, batch=2):
    return np.broadcast_to(
        np.tri(query_length, key_length, dtype=bool), (batch, query_length, key_length)
    )


@pytest.mark.parametrize(
    "layer_arguments",
    [
        {},
        {"rope_layout": "interleaved"},
        {"rope_dim": 4, "rope_max_wavelength": 500000.0},
        {"use_bias": False, "value_dim": 5, "output_shape": 7},
    ],
    ids=["half", "interleaved", "partial", "no-bias"],
)
def test_self_attention_matches_the_reference(in_mode, layer_arguments):
    layer = RotaryMultiHeadAttention(HEADS, KEY_DIM, **layer_arguments)
    attend = in_mode(
        lambda x: layer(x, x, return_attention_scores=True), [tf.TensorSpec([None, None, WIDTH])]
    )
    x = _normal((2, 9, WIDTH), seed=0)
    outputs, scores = attend(tf.constant(x))
    expected, expected_scores = _expected(
        layer, x, x, query_positions=np.arange(9), key_positions=np.arange(9)
    )
    assert_within(outputs, expected)
    assert_within(scores, expected_scores)


def test_cross_attention_with_positions_and_masks_matches_the_reference(in_mode):
    layer = RotaryMultiHeadAttention(HEADS, KEY_DIM, rope_dim=6)
    signature = [
        tf.TensorSpec([None, None, WIDTH]),
        tf.TensorSpec([None, None, 10]),
        tf.TensorSpec([None, None, 10]),
        tf.TensorSpec([None, None], tf.int32),
        tf.TensorSpec([None], tf.int64),
        tf.TensorSpec([None, None, None], tf.bool),
    ]

    def call(query, value, key, query_positions, key_positions, mask):
        return layer(
            query,
            value,
            key=key,
            query_positions=query_positions,
            key_positions=key_positions,
            attention_mask=mask,
            return_attention_scores=True,
        )

    query, value, key = _normal((2, 5, WIDTH), 1), _normal((2, 7, 10), 2), _normal((2, 7, 10), 3)
    query_positions = np.array([[10, 11, 12, 13, 14], [70000, 70001, 3, 2, 1]])
    key_positions = np.array([0, 5, 9, 10, 11, 12, 2**23])
    mask = np.random.default_rng(4).random((2, 5, 7)) < 0.7
    mask[..., 0] = True  # every query sees at least one key
    outputs, scores = in_mode(call, signature)(
        query, value, key, query_positions, key_positions, tf.constant(mask)
    )
    expected, expected_scores = _expected(
        layer,
        query,
        value,
        key=key,
        query_positions=query_positions,
        key_positions=key_positions,
        attention_mask=mask,
    )
    assert_within(outputs, expected)
    assert_within(scores, expected_scores)


def test_start_indices_and_causal_mask_match_the_reference(in_mode):
    layer = RotaryMultiHeadAttention(HEADS, KEY_DIM)
    attend = in_mode(
        lambda q, v, s, t: layer(
            q, v, query_start_index=s, key_start_index=t, use_causal_mask=True
        ),
        [
            tf.TensorSpec([None, None, WIDTH]),
            tf.TensorSpec([None, None, WIDTH]),
            tf.TensorSpec([], tf.int32),
            tf.TensorSpec([], tf.int32),
        ],
    )
    query, value = _normal((2, 6, WIDTH), 5), _normal((2, 6, WIDTH), 6)
    for query_start, key_start in [(0, 0), (4093, 4090), (100000, 99999)]:
        outputs = attend(query, value, tf.constant(query_start), tf.constant(key_start))
        expected, _ = _expected(
            layer,
            query,
            value,
            query_positions=np.arange(query_start, query_start + 6),
            key_positions=np.arange(key_start, key_start + 6),
            attention_mask=_causal(6, 6),
        )
        assert_within(outputs, expected)


def test_scores_depend_only_on_the_relative_position():
    layer = RotaryMultiHeadAttention(HEADS, KEY_DIM)
    x = _normal((1, 8, WIDTH), 7)
    outputs, scores = layer(x, x, return_attention_scores=True)
    for shift in [1, 4093, 99991, 2**23]:
        shifted, shifted_scores = layer(
            x, x, query_start_index=shift, key_start_index=shift, return_attention_scores=True
        )
        # Both are float32 evaluations of the same exact value: within the larger bound, twice.
        positions = np.arange(shift, shift + 8)
        bound, bound_scores = _expected(
            layer, x, x, query_positions=positions, key_positions=positions
        )
        assert_agree(shifted_scores, scores, bound_scores)
        assert_agree(shifted, outputs, bound)
    # A shift of the keys alone changes them.
    _, key_shifted = layer(x, x, key_start_index=3, return_attention_scores=True)
    assert np.abs(key_shifted - scores).max() > 1e-3


def test_attention_is_not_permutation_equivariant_unless_positions_move_with_the_rows():
    layer = RotaryMultiHeadAttention(HEADS, KEY_DIM)
    x = _normal((1, 6, WIDTH), 8)
    permutation = np.array([3, 0, 5, 1, 4, 2])
    outputs = layer(x, x).numpy()
    permuted = layer(x[:, permutation], x[:, permutation]).numpy()
    assert np.abs(permuted - outputs[:, permutation]).max() > 1e-2
    # Each row keeps its own position: the permuted rows give the permuted outputs.
    with_positions = layer(
        x[:, permutation],
        x[:, permutation],
        query_positions=permutation,
        key_positions=permutation,
    )
    expected, _ = _expected(layer, x, x, query_positions=np.arange(6), key_positions=np.arange(6))
    assert_within(outputs, expected)
    assert_agree(with_positions, outputs[:, permutation], expected[:, permutation])


@pytest.mark.parametrize("mode", ["function", "jit"])
def test_decoding_with_a_cache_equals_the_full_causal_pass(in_mode):
    # One token at step t (query_start_index=t) against the states of steps 0..t.
    layer = RotaryMultiHeadAttention(HEADS, KEY_DIM)
    x = _normal((2, 5, WIDTH), 9)
    full = layer(x, x, use_causal_mask=True).numpy()
    step = in_mode(
        lambda token, states, t: layer(token, states, query_start_index=t),
        [
            tf.TensorSpec([None, 1, WIDTH]),
            tf.TensorSpec([None, None, WIDTH]),
            tf.TensorSpec([], tf.int32),
        ],
    )
    expected, _ = _expected(
        layer,
        x,
        x,
        query_positions=np.arange(5),
        key_positions=np.arange(5),
        attention_mask=_causal(5, 5),
    )
    assert_within(full, expected)
    for t in range(5):
        outputs = step(x[:, t : t + 1], x[:, : t + 1], tf.constant(t))
        assert_agree(outputs[:, 0], full[:, t], expected[:, t])


@pytest.mark.parametrize("mode", ["function", "jit"])
def test_graphs_have_no_float64_no_sin_cos_and_capture_only_variables(mode, traced_graph):
    layer = RotaryMultiHeadAttention(HEADS, KEY_DIM)
    layer(tf.zeros((1, 3, WIDTH)), tf.zeros((1, 3, WIDTH)))
    traced = tf.function(
        lambda q, v, s: layer(q, v, query_start_index=s, key_start_index=s),
        input_signature=[
            tf.TensorSpec([None, None, WIDTH]),
            tf.TensorSpec([None, None, WIDTH]),
            tf.TensorSpec([], tf.int32),
        ],
        jit_compile=mode == "jit",
    )
    concrete = traced.get_concrete_function()
    op_types, dtypes = traced_graph(concrete)
    assert tf.float64 not in dtypes
    assert not op_types & {"Sin", "Cos"}
    assert all(t.dtype == tf.resource for t in concrete.captured_inputs)
    assert len(concrete.captured_inputs) == len(layer.weights)


# --- Keras conventions -------------------------------------------------------------------


def test_keras_masks_are_used_and_passed_on():
    ids = np.array([[3, 1, 4, 1, 0, 0], [2, 7, 0, 0, 0, 0]])
    embedded = keras.layers.Embedding(10, WIDTH, mask_zero=True)(ids)
    layer = RotaryMultiHeadAttention(HEADS, KEY_DIM)
    outputs = layer(embedded, embedded)
    np.testing.assert_array_equal(outputs._keras_mask, ids != 0)
    x = keras.ops.convert_to_numpy(embedded)
    padding = ids != 0
    mask = padding[:, :, None] & padding[:, None, :]
    expected, _ = _expected(
        layer, x, x, query_positions=np.arange(6), key_positions=np.arange(6), attention_mask=mask
    )
    # Rows of padded queries are not defined by the mask; compare the real tokens only.
    assert_within(outputs, expected, where=padding)


def test_compute_output_shape():
    layer = RotaryMultiHeadAttention(HEADS, KEY_DIM)
    assert tuple(layer.compute_output_shape((2, 5, WIDTH), (2, 7, 10))) == (2, 5, WIDTH)
    query, value = keras.Input((None, WIDTH)), keras.Input((None, 10))
    assert tuple(layer(query, value).shape) == (None, None, WIDTH)


def test_config_round_trip():
    layer = RotaryMultiHeadAttention(
        3,
        4,
        value_dim=6,
        dropout=0.1,
        rope_max_wavelength=500.0,
        rope_layout="interleaved",
        rope_dim=2,
        name="attention",
    )
    config = layer.get_config()
    clone = RotaryMultiHeadAttention.from_config(config)
    assert clone.get_config() == config
    assert (clone.num_heads, clone.key_dim, clone.value_dim) == (3, 4, 6)
    rope = clone.rotary_embedding
    assert (rope.max_wavelength, rope.layout, rope.rotary_dim) == (500.0, "interleaved", 2)


def test_keras_file_round_trip(tmp_path):
    inputs = keras.Input((None, WIDTH))
    attention = RotaryMultiHeadAttention(HEADS, KEY_DIM, rope_layout="interleaved", rope_dim=4)
    model = keras.Model(inputs, attention(inputs, inputs, use_causal_mask=True))
    path = tmp_path / "attention.keras"
    model.save(path)
    loaded = keras.models.load_model(path)
    layer = next(la for la in loaded.layers if isinstance(la, RotaryMultiHeadAttention))
    assert (layer.rotary_embedding.layout, layer.rotary_embedding.rotary_dim) == ("interleaved", 4)
    x = _normal((2, 9, WIDTH), 10)
    np.testing.assert_array_equal(loaded(x), model(x))
    expected, _ = _expected(
        layer,
        x,
        x,
        query_positions=np.arange(9),
        key_positions=np.arange(9),
        attention_mask=_causal(9, 9),
    )
    assert_within(loaded(x), expected)


@pytest.mark.parametrize("policy", ["mixed_bfloat16", "mixed_float16"])
def test_mixed_precision_computes_in_the_compute_dtype(policy):
    layer = RotaryMultiHeadAttention(HEADS, KEY_DIM, dtype=policy)
    x = _normal((2, 6, WIDTH), 11)
    outputs = layer(x, x, query_start_index=5000, key_start_index=5000)
    assert outputs.dtype == tf.as_dtype(policy.removeprefix("mixed_"))
    assert all(w.dtype == "float32" for w in layer.weights)
    expected, _ = _expected(
        layer, x, x, query_positions=np.arange(5000, 5006), key_positions=np.arange(5000, 5006)
    )
    tolerance = 0.1 if policy == "mixed_bfloat16" else 2e-2
    np.testing.assert_allclose(
        outputs.numpy().astype(np.float64), expected.value, rtol=0, atol=tolerance
    )


# --- Errors ------------------------------------------------------------------------------


def test_attention_axes_other_than_the_sequence_are_an_error():
    with pytest.raises(ValueError, match=r"attention_axes=\(1, 2\) is not supported"):
        RotaryMultiHeadAttention(HEADS, KEY_DIM, attention_axes=(1, 2))


def test_odd_key_dim_is_an_error_naming_it():
    with pytest.raises(ValueError, match=r"must be even.*got 7"):
        RotaryMultiHeadAttention(HEADS, 7)(tf.zeros((1, 3, 4)), tf.zeros((1, 3, 4)))


def test_rotary_dim_wider_than_the_head_is_an_error():
    with pytest.raises(ValueError, match=r"rotary_dim=16 is larger than the feature axis \(8\)"):
        RotaryMultiHeadAttention(HEADS, 8, rope_dim=16)(tf.zeros((1, 3, 4)), tf.zeros((1, 3, 4)))


def test_unknown_rotary_layout_is_an_error():
    with pytest.raises(ValueError, match=r"Unknown layout 'concat'"):
        RotaryMultiHeadAttention(HEADS, KEY_DIM, rope_layout="concat")


def test_bad_positions_are_errors_naming_the_value():
    layer = RotaryMultiHeadAttention(HEADS, KEY_DIM)
    x = tf.zeros((1, 3, WIDTH))
    with pytest.raises(ValueError, match=r"start_index must be >= 0, got -1"):
        layer(x, x, query_start_index=-1)
    with pytest.raises(ValueError, match=r"positions cover 2 steps but the input sequence has 3"):
        layer(x, x, key_positions=[0, 1])
    with pytest.raises(TypeError, match=r"positions must be integers"):
        layer(x, x, query_positions=[0.0, 1.0, 2.0])


def test_position_arguments_work_in_the_functional_api():
    """Positions given as symbolic inputs build a model that equals the eager call."""
    states = keras.Input((None, 32))
    start = keras.Input((), dtype="int32", batch_size=1)
    attention = RotaryMultiHeadAttention(num_heads=2, key_dim=16)
    outputs = attention(
        states, states, query_start_index=start[0], key_start_index=start[0], use_causal_mask=True
    )
    model = keras.Model([states, start], outputs)
    x = np.random.default_rng(0).normal(size=(1, 5, 32)).astype(np.float32)
    eager = attention(x, x, query_start_index=7, key_start_index=7, use_causal_mask=True)
    shifted = attention(x, x, use_causal_mask=True)
    positions = np.arange(7, 12)
    expected, _ = _expected(
        attention,
        x,
        x,
        query_positions=positions,
        key_positions=positions,
        attention_mask=_causal(5, 5, batch=1),
    )
    assert_within(eager, expected)
    assert_agree(model([x, np.array([7], np.int32)]), eager, expected)
    # Same relative positions, same output: the start index is really used (and harmless).
    assert_agree(eager, shifted, expected)
    with_positions = attention(x, x, query_positions=np.arange(5) * 3, use_causal_mask=True)
    assert np.abs(with_positions.numpy() - shifted.numpy()).max() > 1e-3


# --- The house: names, weights, the fused causal path, re-entrant calls ------------------


def test_the_old_rope_names_are_still_read():
    old = {
        "max_wavelength": 500.0,
        "rotary_layout": "interleaved",
        "rotary_dim": 4,
        "rotary_scaling": {"rope_type": "linear", "factor": 2.0},
    }
    new = RotaryMultiHeadAttention(HEADS, KEY_DIM, name="a", **old)
    config = new.get_config()
    assert {k: config[k] for k in ("rope_max_wavelength", "rope_layout", "rope_dim")} == {
        "rope_max_wavelength": 500.0,
        "rope_layout": "interleaved",
        "rope_dim": 4,
    }
    assert config["rope_scaling"]["factor"] == 2.0
    assert not set(old) & set(config)
    # A config saved before the rename (old names in place of the new ones) loads.
    saved = {k: v for k, v in config.items() if not k.startswith("rope_")} | old
    assert RotaryMultiHeadAttention.from_config(saved).get_config() == config
    with pytest.raises(ValueError, match="both rope_dim=2 and its old name rotary_dim=4"):
        RotaryMultiHeadAttention(HEADS, KEY_DIM, rope_dim=2, rotary_dim=4)


def test_the_weights_are_exactly_multi_head_attentions():
    x = _normal((2, 5, WIDTH), 12)
    for options in ({}, {"use_bias": False, "value_dim": 5, "output_shape": 7}):
        rotary = RotaryMultiHeadAttention(HEADS, KEY_DIM, **options)
        plain = keras.layers.MultiHeadAttention(HEADS, KEY_DIM, **options)
        rotary(x, x)
        plain(x, x)
        # The same variables under the same names within the layer.
        assert [(w.path.split("/", 1)[1], w.shape) for w in rotary.weights] == [
            (w.path.split("/", 1)[1], w.shape) for w in plain.weights
        ]
        # Same weights, no rotation at all (all positions 0): the same outputs.
        plain.set_weights(rotary.get_weights())
        zeros = np.zeros(5, np.int32)
        expected, _ = _expected(rotary, x, x, query_positions=zeros, key_positions=zeros)
        assert_within(plain(x, x), expected)
        assert_agree(
            rotary(x, x, query_positions=zeros, key_positions=zeros), plain(x, x), expected
        )


@pytest.mark.parametrize("mode", ["eager", "jit"])
def test_use_causal_mask_equals_an_explicit_causal_mask(in_mode):
    layer = RotaryMultiHeadAttention(HEADS, KEY_DIM)
    x = _normal((2, 7, WIDTH), 13)
    causal = tf.constant(_causal(7, 7))
    attend = in_mode(
        lambda x, s: (
            layer(x, x, use_causal_mask=True, query_start_index=s, key_start_index=s),
            layer(x, x, attention_mask=causal, query_start_index=s, key_start_index=s),
            layer(x, x, use_causal_mask=True, return_attention_scores=True)[0],
        ),
        [tf.TensorSpec([2, 7, WIDTH]), tf.TensorSpec([], tf.int32)],
    )
    fused, masked, explicit = attend(tf.constant(x), tf.constant(40))
    expected, _ = _expected(
        layer, x, x, query_positions=np.arange(7), key_positions=np.arange(7), attention_mask=causal
    )
    for got in (fused, masked, explicit):
        assert_within(got, expected)


def test_the_fused_attention_path_is_used_without_scores():
    """No `_compute_attention` override: Keras's `ops.dot_product_attention` does the work."""
    assert "_compute_attention" not in vars(RotaryMultiHeadAttention)
    layer = RotaryMultiHeadAttention(HEADS, KEY_DIM)
    x = tf.zeros((1, 4, WIDTH))
    layer(x, x)
    calls = []
    original = keras.ops.dot_product_attention

    def spy(*args, **kwargs):
        calls.append(tuple(kwargs["mask"].shape))
        return original(*args, **kwargs)

    keras.ops.dot_product_attention = spy
    try:
        layer(x, x, use_causal_mask=True)
        layer(x, x, use_causal_mask=True, return_attention_scores=True)
    finally:
        keras.ops.dot_product_attention = original
    # The causal mask made of LiteRT built-in ops (the TensorFlow backend's `is_causal`
    # makes the same one with a Flex op); with scores, the explicit product instead.
    assert calls == [(1, 1, 4, 4)]


def _threads(work, count=8):
    errors, results = [], {}
    barrier = threading.Barrier(count)

    def run(i):
        try:
            barrier.wait()
            results[i] = work(i)
        except Exception as error:  # noqa: BLE001 - reported below
            errors.append(error)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    return results


@pytest.mark.parametrize("tracing", [False, True], ids=["eager", "tracing"])
def test_concurrent_calls_keep_their_own_positions(tracing):
    """One layer, 8 threads, each with its own start: each gets its own answer."""
    layer = RotaryMultiHeadAttention(HEADS, KEY_DIM)
    x = _normal((1, 4, WIDTH), 14)
    layer(x, x)
    starts = [0, 1, 7, 100, 4093, 5000, 70000, 2**20]
    expected = {
        i: _expected(layer, x, x, query_positions=np.arange(s, s + 4), key_positions=np.arange(4))[
            0
        ]
        for i, s in enumerate(starts)
    }

    def work(i):
        if tracing:
            # Each thread traces its own function with a Python int start at the same time.
            call = tf.function(lambda: layer(x, x, query_start_index=starts[i]))
            return [call().numpy() for _ in range(3)]
        return [layer(x, x, query_start_index=starts[i]).numpy() for _ in range(20)]

    for i, outputs in _threads(work).items():
        for output in outputs:
            assert_within(output, expected[i])


def _conditionals(function, *specs) -> int:
    graph = tf.function(function, input_signature=list(specs)).get_concrete_function().graph
    return sum(op.type in ("If", "StatelessIf") for op in graph.get_operations())


def test_self_attention_looks_up_its_rows_once():
    # The run-time choice between cached and computed rows is one conditional per lookup;
    # queries and keys at the same positions share it, and an exported graph holds one.
    layer = RotaryMultiHeadAttention(HEADS, KEY_DIM)
    layer(tf.zeros((1, 3, WIDTH)), tf.zeros((1, 3, WIDTH)))
    sequence, start = tf.TensorSpec([None, None, WIDTH]), tf.TensorSpec([], tf.int32)
    one_lookup = _conditionals(
        lambda heads, s: layer.rotary_embedding(heads, start_index=s),
        tf.TensorSpec([None, None, HEADS, KEY_DIM]),
        start,
    )
    assert one_lookup >= 1
    self_attention = _conditionals(
        lambda q, s: layer(q, q, query_start_index=s, key_start_index=s), sequence, start
    )
    cross_attention = _conditionals(
        lambda q, v, s: layer(q, v, query_start_index=s, key_start_index=s),
        sequence,
        sequence,
        start,
    )
    assert (self_attention, cross_attention) == (one_lookup, 2 * one_lookup)
