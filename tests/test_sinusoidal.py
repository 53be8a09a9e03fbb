"""`SinusoidalPositionalEncoding`, `sinusoidal_table` and `SinusoidalInitializer`."""

from __future__ import annotations

import math

import keras
import ml_dtypes
import numpy as np
import pytest
import reference
import tensorflow as tf
from attention_error import attention_error
from float32_error import TABLE_ERROR, assert_within_bound, position_sum_error, table_dot_error
from hypothesis import given
from hypothesis import strategies as st

import keras_posenc
from keras_posenc import (
    SinusoidalInitializer,
    SinusoidalPositionalEncoding,
    sinusoidal_table,
)

# A table entry's float32 bound (float32_error: the split's products and sum, |t| <= 1).
TABLE_TOLERANCE = TABLE_ERROR
LAYOUTS = ["interleaved", "concat"]


def _sequence_signature(width, extra=None):
    signature = [tf.TensorSpec([None, None, width], tf.float32)]
    return signature + ([extra] if extra is not None else [])


# --- The seeds' worked examples ----------------------------------------------------------


def test_position_zero_of_the_seed_example_is_0_1_0_1_0_1():
    encoding = SinusoidalPositionalEncoding()(tf.zeros((1, 2, 6)))
    np.testing.assert_array_equal(encoding[0, 0], [0, 1, 0, 1, 0, 1])
    # Position 1 with ω = (1, 10000^(-2/6), 10000^(-4/6)).
    omega = [1.0, 10000.0 ** (-2 / 6), 10000.0 ** (-4 / 6)]
    expected = [f(w) for w in omega for f in (math.sin, math.cos)]
    np.testing.assert_allclose(encoding[0, 1], expected, rtol=0, atol=6e-8)


def test_dot_product_of_a_frequency_pair_depends_only_on_the_offset():
    width = 6
    encoding = SinusoidalPositionalEncoding()(tf.zeros((1, 20, width)))[0].numpy()
    omega = reference.inverse_frequencies(width)
    for k in range(width // 2):
        pair = encoding[:, 2 * k : 2 * k + 2].astype(np.float64)
        for i, j in [(3, 7), (13, 17), (0, 19), (5, 5)]:
            exact = math.cos((i - j) * omega[k])
            assert pair[i] @ pair[j] == pytest.approx(exact, abs=table_dot_error(2))
        assert pair[3] @ pair[7] == pytest.approx(pair[13] @ pair[17], abs=2 * table_dot_error(2))
    whole = encoding.astype(np.float64)
    bound = 2 * table_dot_error(width)
    assert whole[3] @ whole[7] == pytest.approx(whole[13] @ whole[17], abs=bound)


def test_self_attention_is_permutation_equivariant_without_positions_and_not_with_them():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(1, 6, 8)).astype(np.float32)
    permutation = np.array([3, 0, 5, 1, 4, 2])
    attention = keras.layers.MultiHeadAttention(num_heads=2, key_dim=4)
    encode = SinusoidalPositionalEncoding()

    def attend(inputs):
        return attention(inputs, inputs).numpy()

    # Two float32 attentions of the same rows in another order: each within the bound of
    # the exact one (`attention_error`, full self-attention, probabilities of a float64 twin).
    straight, permuted = attend(x), attend(x[:, permutation])
    twin = keras.layers.MultiHeadAttention.from_config(
        {**attention.get_config(), "dtype": "float64"}
    )
    x64 = x.astype(np.float64)
    twin(x64, x64)
    twin.set_weights([w.astype(np.float64) for w in attention.get_weights()])
    _, weights = twin(x64, x64, return_attention_scores=True)
    kernels = {}
    for variable in attention.weights:
        role, kind = variable.path.split("/")[-2:]
        role = {"attention_output": "output"}.get(role, role)
        value = np.asarray(variable, np.float64)
        if kind == "kernel":
            kernels[role] = value.reshape(8, -1) if role != "output" else value.reshape(-1, 8)
        else:
            kernels[f"{role}_bias"] = value.ravel()
    bound = attention_error(
        x64,
        kernels,
        heads=2,
        kv_heads=2,
        head_dim=4,
        scale=0.5,
        weights=np.asarray(weights),
        table_error=0.0,
        causal=False,
    )
    assert_within_bound(permuted, straight[:, permutation], 2 * bound[:, permutation])
    with_positions = attend(encode(x).numpy())
    permuted_with_positions = attend(encode(x[:, permutation]).numpy())
    difference = np.abs(permuted_with_positions - with_positions[:, permutation]).max()
    assert difference > 1e-2 and difference > 100 * bound.max()


# --- Values against the float64 formula ---------------------------------------------------


@pytest.mark.parametrize("layout", LAYOUTS)
def test_encoding_matches_the_formula(in_mode, positions_case, position_kind, layout):
    batch, length, width = 2, 11, 12
    case = positions_case(position_kind, batch, length)
    layer = SinusoidalPositionalEncoding(layout=layout)
    encode = in_mode(case.bind(layer), case.signature(tf.TensorSpec([None, None, width])))
    x = np.random.default_rng(1).uniform(-1, 1, (batch, length, width)).astype(np.float32)
    outputs = encode(*case.arguments(x))
    assert outputs.dtype == tf.float32 and outputs.shape == (batch, length, width)
    expected = x + reference.sinusoidal(case.positions, width, layout=layout)
    assert_within_bound(outputs, expected, position_sum_error(x))


@given(
    half_width=st.integers(1, 40),
    positions=st.lists(st.integers(0, 2**24 - 1), min_size=1, max_size=12),
    layout=st.sampled_from(LAYOUTS),
    max_wavelength=st.sampled_from([10000.0, 500000.0, 2.5]),
)
def test_encoding_matches_the_formula_for_any_width_and_positions(
    half_width, positions, layout, max_wavelength
):
    width = 2 * half_width
    layer = SinusoidalPositionalEncoding(max_wavelength, layout=layout)
    outputs = layer(tf.zeros((1, len(positions), width)), positions=positions)
    expected = reference.sinusoidal([positions], width, max_wavelength, layout)
    np.testing.assert_allclose(outputs, expected, rtol=0, atol=TABLE_TOLERANCE)


def test_every_position_below_2_to_the_20_through_start_index(in_mode):
    width, chunk = 16, 65536
    layer = SinusoidalPositionalEncoding()
    zeros = tf.zeros((1, chunk, width))
    encode = in_mode(
        lambda x, s: layer(x, start_index=s),
        _sequence_signature(width, tf.TensorSpec([], tf.int32)),
    )
    worst = 0.0
    for start in range(0, 2**20, chunk):
        encoding = encode(zeros, tf.constant(start))[0].numpy()
        expected = reference.sinusoidal(np.arange(start, start + chunk), width)
        worst = max(worst, np.abs(encoding - expected).max())
    assert worst <= TABLE_TOLERANCE


def test_python_int_start_index_past_the_cache():
    width = 16
    layer = SinusoidalPositionalEncoding()
    for start in [0, 4000, 4096, 4097, 65536 * 5 + 3, 2**24 - 64]:
        encoding = layer(tf.zeros((2, 64, width)), start_index=start)
        expected = reference.sinusoidal(np.arange(start, start + 64), width)
        np.testing.assert_allclose(encoding[1], expected, rtol=0, atol=TABLE_TOLERANCE)


@given(
    start=st.one_of(st.integers(0, 5000), st.integers(0, 2**24 - 65)),
    length=st.integers(1, 64),
    layout=st.sampled_from(LAYOUTS),
)
def test_start_index_gives_exactly_the_positions_of_its_run(start, length, layout):
    layer = SinusoidalPositionalEncoding(layout=layout)
    x = tf.zeros((1, length, 8))
    by_int = layer(x, start_index=start)
    by_tensor = layer(x, start_index=tf.constant(start))
    by_positions = layer(x, positions=np.arange(start, start + length))
    np.testing.assert_array_equal(by_int, by_positions)
    np.testing.assert_array_equal(by_tensor, by_positions)


def test_start_index_tensor_gives_exactly_the_positions_in_graphs(in_mode):
    layer = SinusoidalPositionalEncoding()
    by_start = in_mode(
        lambda x, s: layer(x, start_index=s), _sequence_signature(8, tf.TensorSpec([], tf.int32))
    )
    by_positions = in_mode(
        lambda x, p: layer(x, positions=p), _sequence_signature(8, tf.TensorSpec([None], tf.int32))
    )
    x = tf.zeros((2, 20, 8))
    for start in [0, 100, 4076, 4080, 4095, 4096, 9999, 2**24 - 20]:
        np.testing.assert_array_equal(
            by_start(x, tf.constant(start)), by_positions(x, tf.range(start, start + 20))
        )


def test_dynamic_sequence_length_in_one_trace(in_mode):
    layer = SinusoidalPositionalEncoding()
    encode = in_mode(lambda x: layer(x), _sequence_signature(8))
    for length in [1, 3, 4096, 4097, 5000]:
        encoding = encode(tf.zeros((1, length, 8)))
        np.testing.assert_allclose(
            encoding[0], reference.sinusoidal(np.arange(length), 8), rtol=0, atol=TABLE_TOLERANCE
        )


# --- Dtype policies ----------------------------------------------------------------------

POLICIES = [
    pytest.param("mixed_bfloat16", ml_dtypes.bfloat16, 7, id="bfloat16"),
    pytest.param("mixed_float16", np.float16, 10, id="float16"),
]


def test_bfloat16_encoding_is_within_2e_3_up_to_position_1e5(in_mode):
    layer = SinusoidalPositionalEncoding(dtype="mixed_bfloat16")
    encode = in_mode(lambda x: layer(x), [tf.TensorSpec([None, None, 16], tf.bfloat16)])
    encoding = encode(tf.zeros((1, 100_001, 16), tf.bfloat16))
    assert encoding.dtype == tf.bfloat16
    expected = reference.sinusoidal(np.arange(100_001), 16)
    assert np.abs(encoding[0].numpy().astype(np.float64) - expected).max() <= 2e-3


@pytest.mark.parametrize(("policy", "numpy_dtype", "mantissa_bits"), POLICIES)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_mixed_precision_rounds_the_result_once(policy, numpy_dtype, mantissa_bits, layout):
    # x + p is computed with the float32 table and rounded once to the compute dtype:
    # every value is within half a unit in the last place of the exact sum (plus the
    # table's own float32 error), never a rounding of a rounding.
    layer = SinusoidalPositionalEncoding(layout=layout, dtype=policy)
    x = np.random.default_rng(2).uniform(-1, 1, (4, 256, 16)).astype(numpy_dtype)
    start = 9000
    outputs = layer(x, start_index=start)
    assert outputs.dtype == tf.as_dtype(policy.removeprefix("mixed_"))
    exact = x.astype(np.float64) + reference.sinusoidal(
        np.arange(start, start + 256), 16, layout=layout
    )
    reference.assert_rounded_once(outputs.numpy(), exact, mantissa_bits)


def test_float64_policy_keeps_float64_inputs():
    layer = SinusoidalPositionalEncoding(dtype="float64")
    x = np.random.default_rng(3).uniform(-1, 1, (1, 9, 8))
    outputs = layer(x, start_index=70000)
    assert outputs.dtype == tf.float64
    expected = x + reference.sinusoidal(np.arange(70000, 70009), 8)
    np.testing.assert_allclose(outputs, expected, rtol=0, atol=TABLE_TOLERANCE)


# --- Errors ------------------------------------------------------------------------------


def test_odd_width_is_an_error_naming_it():
    with pytest.raises(ValueError, match=r"must be even.*got 7.*even width"):
        SinusoidalPositionalEncoding()(tf.zeros((1, 3, 7)))


def test_unknown_layout_is_an_error_listing_the_choices():
    with pytest.raises(ValueError, match=r"Unknown layout 'half'.*'interleaved', 'concat'"):
        SinusoidalPositionalEncoding(layout="half")


@pytest.mark.parametrize("shape", [(3, 8), (1, 2, 3, 8)])
def test_wrong_input_rank_is_an_error_naming_the_shape(shape):
    with pytest.raises(ValueError, match=r"\(batch, sequence, width\).*" + re_shape(shape)):
        SinusoidalPositionalEncoding()(tf.zeros(shape))


def re_shape(shape):
    return r"\(" + r", ".join(str(d) for d in shape) + r"\)"


@pytest.mark.parametrize(
    ("positions", "error", "pattern"),
    [
        ([[[0, 1, 2]]], ValueError, r"\(sequence,\) or \(batch, sequence\).*\(1, 1, 3\)"),
        ([0, 1], ValueError, r"positions cover 2 steps but the input sequence has 3"),
        ([0.0, 1.0, 2.0], TypeError, r"integers.*float32.*tf.cast"),
        ([0, -1, 2], ValueError, r"positions must be >= 0.*-1"),
        ([0, 1, 2**24], ValueError, rf"largest position is {2**24}.*below {2**24}"),
    ],
)
def test_bad_positions_are_errors_naming_the_value(positions, error, pattern):
    with pytest.raises(error, match=pattern):
        SinusoidalPositionalEncoding()(tf.zeros((1, 3, 8)), positions=tf.constant(positions))


@pytest.mark.parametrize(
    ("start_index", "error", "pattern"),
    [
        (-2, ValueError, r"start_index must be >= 0, got -2"),
        (tf.constant(-5), ValueError, r"start_index must be >= 0, got -5"),
        (tf.constant(1.0), TypeError, r"start_index must be an int32 or int64.*float32"),
        (tf.constant([1, 2]), ValueError, r"start_index must be a scalar.*\(2,\)"),
        (True, TypeError, r"start_index must be an integer, got the bool True"),
        (2**24 - 2, ValueError, rf"run to {2**24 + 1}.*within {2**24}"),
    ],
)
def test_bad_start_index_is_an_error_naming_the_value(start_index, error, pattern):
    with pytest.raises(error, match=pattern):
        SinusoidalPositionalEncoding()(tf.zeros((1, 3, 8)), start_index=start_index)


def test_positions_and_start_index_together_is_an_error():
    with pytest.raises(ValueError, match=r"either `positions` or `start_index`"):
        SinusoidalPositionalEncoding()(tf.zeros((1, 3, 8)), positions=[0, 1, 2], start_index=4)


def test_graph_mode_negative_start_index_asserts_with_the_value():
    layer = SinusoidalPositionalEncoding()
    encode = tf.function(
        lambda x, s: layer(x, start_index=s),
        input_signature=_sequence_signature(8, tf.TensorSpec([], tf.int32)),
    )
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"start_index must be >= 0(.|\n)*-3"):
        encode(tf.zeros((1, 4, 8)), tf.constant(-3))


def test_graph_mode_bad_positions_assert_with_the_values():
    layer = SinusoidalPositionalEncoding()
    encode = tf.function(
        lambda x, p: layer(x, positions=p),
        input_signature=_sequence_signature(8, tf.TensorSpec([None, None], tf.int32)),
    )
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"positions must be >= 0(.|\n)*-7"):
        encode(tf.zeros((1, 3, 8)), tf.constant([[0, -7, 1]]))
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"positions cover(.|\n)*\[4\] \[3\]"):
        encode(tf.zeros((1, 3, 8)), tf.constant([[0, 1, 2, 3]]))


# --- The numpy table and the initializer -------------------------------------------------


@pytest.mark.parametrize("layout", LAYOUTS)
def test_sinusoidal_table_is_the_formula_rounded_once(layout):
    table = sinusoidal_table(5000, 24, 10000.0, layout)
    assert table.dtype == np.float32 and table.shape == (5000, 24)
    expected = reference.sinusoidal(np.arange(5000), 24, layout=layout)
    np.testing.assert_array_equal(table, expected.astype(np.float32))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_sinusoidal_initializer(layout):
    initializer = SinusoidalInitializer(max_wavelength=300.0, layout=layout)
    values = initializer((40, 10))
    expected = reference.sinusoidal(np.arange(40), 10, 300.0, layout)
    np.testing.assert_array_equal(values, expected.astype(np.float32))
    assert (
        keras.ops.convert_to_numpy(initializer((4, 6), dtype="bfloat16")).dtype
        == ml_dtypes.bfloat16
    )
    clone = keras.initializers.deserialize(keras.initializers.serialize(initializer))
    assert isinstance(clone, SinusoidalInitializer)
    assert clone.get_config() == {
        "max_wavelength": 300.0,
        "layout": layout,
        "frequency_spacing": "vaswani",
    }


def test_sinusoidal_initializer_errors():
    with pytest.raises(ValueError, match=r"\(length, width\).*\(2, 3, 4\)"):
        SinusoidalInitializer()((2, 3, 4))
    with pytest.raises(ValueError, match=r"must be even.*got 5"):
        SinusoidalInitializer()((3, 5))
    with pytest.raises(ValueError, match=r"Unknown layout 'half'"):
        SinusoidalInitializer(layout="half")


def test_under_xla_bad_positions_give_nan_not_a_plausible_encoding():
    layer = SinusoidalPositionalEncoding()
    encode = tf.function(lambda x, p: layer(x, positions=p), jit_compile=True)
    x = tf.zeros((1, 3, 8))
    assert np.isfinite(encode(x, tf.constant([0, 5, 9])).numpy()).all()
    assert np.isnan(encode(x, tf.constant([0, -1, 9])).numpy()).all()
    assert np.isnan(encode(x, tf.constant([0, 1, 2**24 + 5])).numpy()).all()


# --------------------------------------------------------------------------------------
# The tensor2tensor spacing of real checkpoints (tensor2tensor, fairseq, Whisper)


def _whisper_sinusoids(length: int, channels: int, max_timescale: float = 10000.0):
    # transformers' models/whisper `sinusoids`, restated in float64 numpy.
    increment = np.log(max_timescale) / (channels // 2 - 1)
    inverse_timescales = np.exp(-increment * np.arange(channels // 2))
    scaled_time = np.arange(length)[:, None] * inverse_timescales[None, :]
    return np.concatenate([np.sin(scaled_time), np.cos(scaled_time)], axis=1)


def _fairseq_embedding(num_embeddings: int, embedding_dim: int):
    # fairseq's SinusoidalPositionalEmbedding.get_embedding (even width), in float64.
    half_dim = embedding_dim // 2
    step = np.log(10000) / (half_dim - 1)
    frequencies = np.exp(np.arange(half_dim, dtype=np.float64) * -step)
    angles = np.arange(num_embeddings, dtype=np.float64)[:, None] * frequencies[None, :]
    return np.concatenate([np.sin(angles), np.cos(angles)], axis=1)


@pytest.mark.parametrize("width", [4, 16, 384])
def test_tensor2tensor_spacing_is_whispers_table(width):
    expected = _whisper_sinusoids(1500, width)
    table = sinusoidal_table(1500, width, layout="concat", frequency_spacing="tensor2tensor")
    np.testing.assert_allclose(table, expected, rtol=0, atol=1e-7)
    # The last pair's frequency is exactly 1/max_wavelength (Vaswani's stops short of it).
    last = keras_posenc.inverse_frequencies(width, 10000.0, "tensor2tensor")[-1]
    assert last == pytest.approx(1e-4, rel=1e-12)


def test_tensor2tensor_spacing_is_fairseqs_table_in_the_layer():
    width, length = 32, 600
    layer = SinusoidalPositionalEncoding(layout="concat", frequency_spacing="tensor2tensor")
    x = np.zeros((1, length, width), np.float32)
    np.testing.assert_allclose(
        layer(x)[0], _fairseq_embedding(length, width), rtol=0, atol=TABLE_ERROR
    )
    # Past the cached rows too (the split tables carry the spacing).
    np.testing.assert_allclose(
        layer(x, start_index=9000)[0],
        _fairseq_embedding(9000 + length, width)[9000:],
        rtol=0,
        atol=TABLE_ERROR,
    )


def test_the_two_spacings_differ_and_are_kept_in_the_config():
    vaswani = sinusoidal_table(64, 16, layout="concat")
    t2t = sinusoidal_table(64, 16, layout="concat", frequency_spacing="tensor2tensor")
    assert np.abs(vaswani - t2t).max() > 0.5  # the silent error of mixing them up
    layer = SinusoidalPositionalEncoding(frequency_spacing="tensor2tensor")
    clone = SinusoidalPositionalEncoding.from_config(layer.get_config())
    assert clone.frequency_spacing == "tensor2tensor"
    with pytest.raises(ValueError, match="frequency_spacing"):
        SinusoidalPositionalEncoding(frequency_spacing="fairseq")
