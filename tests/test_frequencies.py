"""The shared frequency table: exact sin/cos at every position, cached, float32-only graphs."""

from __future__ import annotations

import math
import re

import keras
import numpy as np
import pytest
import reference
import tensorflow as tf
from float32_error import TABLE_ERROR
from hypothesis import given
from hypothesis import strategies as st

import keras_posenc
from keras_posenc.frequencies import (
    CACHED_POSITIONS,
    MAX_POSITIONS,
    FrequencyTable,
    inverse_frequencies,
)

WIDTH = 16
ALL_POSITIONS = 2**20
# A table entry's float32 bound (float32_error: the split's products and sum, |t| <= 1).
TABLE_TOLERANCE = TABLE_ERROR


def test_inverse_frequencies_of_the_seed_example():
    # The seeds' d = 6: ω = (1, 10000^(-2/6), 10000^(-4/6)).
    np.testing.assert_allclose(
        inverse_frequencies(6),
        [1.0, 0.046415888336127795, 0.0021544346900318843],
        rtol=1e-15,
    )
    assert inverse_frequencies(6).dtype == np.float64


@given(
    half_width=st.integers(1, 256),
    max_wavelength=st.floats(1.5, 1e6, allow_nan=False, allow_infinity=False),
)
def test_inverse_frequencies_match_the_formula(half_width, max_wavelength):
    width = 2 * half_width
    np.testing.assert_allclose(
        inverse_frequencies(width, max_wavelength),
        reference.inverse_frequencies(width, max_wavelength),
        rtol=1e-13,
    )


def test_wavelengths_are_two_pi_times_base_to_the_2k_over_d():
    # λ_k = 2π·10000^(2k/d): pair 0 has wavelength 2π, the last one just under 2π·10000.
    width = 6
    wavelengths = 2 * math.pi / inverse_frequencies(width)
    expected = [2 * math.pi * 10000.0 ** (2 * k / width) for k in range(width // 2)]
    np.testing.assert_allclose(wavelengths, expected, rtol=1e-14)
    assert wavelengths[0] == pytest.approx(2 * math.pi)
    assert wavelengths[-1] < 2 * math.pi * 10000.0


@pytest.mark.parametrize("width", [7, 1, 0, -4, 2.0, True, "8"])
def test_inverse_frequencies_reject_widths_that_are_not_positive_even_integers(width):
    with pytest.raises(ValueError, match=rf"dim must be .*{re.escape(repr(width))}"):
        inverse_frequencies(width)


@pytest.mark.parametrize("max_wavelength", [1.0, 0.5, -10000.0, float("nan"), float("inf"), "a"])
def test_inverse_frequencies_reject_a_bad_base(max_wavelength):
    with pytest.raises(ValueError, match=r"max_wavelength must be a finite number > 1"):
        inverse_frequencies(8, max_wavelength)


def _max_error(sin, cos, first_position):
    """Max abs error of `(sin, cos)` rows of consecutive positions from `first_position`."""
    worst = 0.0
    chunk = 65536
    for start in range(0, len(sin), chunk):
        theta = reference.angles(
            np.arange(first_position + start, first_position + start + chunk), WIDTH
        )
        worst = max(
            worst,
            np.abs(sin[start : start + chunk] - np.sin(theta)).max(),
            np.abs(cos[start : start + chunk] - np.cos(theta)).max(),
        )
    return worst


def test_sin_cos_is_exact_at_every_position_below_2_to_the_20(in_mode):
    table = FrequencyTable(inverse_frequencies(WIDTH))
    sin_cos = in_mode(table.sin_cos, [tf.TensorSpec([None], tf.int32)])
    sin, cos = sin_cos(tf.range(ALL_POSITIONS, dtype=tf.int32))
    assert sin.dtype == cos.dtype == tf.float32
    assert sin.shape == cos.shape == (ALL_POSITIONS, WIDTH // 2)
    assert _max_error(sin.numpy(), cos.numpy(), 0) <= TABLE_TOLERANCE


@pytest.mark.parametrize("dtype", [tf.int32, tf.int64])
def test_sin_cos_takes_positions_of_any_shape_and_int_dtype(in_mode, dtype):
    table = FrequencyTable(inverse_frequencies(WIDTH, 500000.0))
    sin_cos = in_mode(table.sin_cos, [tf.TensorSpec([None, None, None], dtype)])
    rng = np.random.default_rng(0)
    positions = rng.integers(0, MAX_POSITIONS, size=(3, 5, 7))
    positions[0, 0, :3] = [0, CACHED_POSITIONS - 1, MAX_POSITIONS - 1]
    sin, cos = sin_cos(tf.constant(positions, dtype))
    theta = reference.angles(positions, WIDTH, 500000.0)
    assert sin.shape == cos.shape == (3, 5, 7, WIDTH // 2)
    np.testing.assert_allclose(sin, np.sin(theta), rtol=0, atol=TABLE_TOLERANCE)
    np.testing.assert_allclose(cos, np.cos(theta), rtol=0, atol=TABLE_TOLERANCE)


def test_sin_cos_graph_has_no_float64_and_no_sin_or_cos(traced_graph):
    table = FrequencyTable(inverse_frequencies(WIDTH))
    for jit in (False, True):
        traced = tf.function(
            table.sin_cos, input_signature=[tf.TensorSpec([None], tf.int64)], jit_compile=jit
        )
        concrete = traced.get_concrete_function()
        op_types, dtypes = traced_graph(concrete)
        assert tf.float64 not in dtypes
        assert not op_types & {"Sin", "Cos"}, "sin/cos are recomputed in the graph"
        assert not concrete.captured_inputs, "an eager constant is captured by the graph"


def _layer_calls():
    """(layer factory, input rank) for every layer that takes positions."""
    return [
        pytest.param(lambda: keras_posenc.SinusoidalPositionalEncoding(), 3, id="sinusoidal"),
        pytest.param(
            lambda: keras_posenc.SinusoidalPositionalEncoding(layout="concat"), 3, id="concat"
        ),
        pytest.param(lambda: keras_posenc.LearnedPositionalEmbedding(8192), 3, id="learned"),
        pytest.param(lambda: keras_posenc.RotaryEmbedding(), 4, id="rotary"),
        pytest.param(
            lambda: keras_posenc.RotaryEmbedding(layout="interleaved", rotary_dim=4),
            3,
            id="rotary-partial",
        ),
    ]


@pytest.mark.parametrize("jit", [False, True], ids=["function", "jit"])
@pytest.mark.parametrize("how", ["start_index", "positions"])
@pytest.mark.parametrize(("make_layer", "rank"), _layer_calls())
def test_layer_graphs_have_no_float64_no_sin_cos_and_no_captured_constants(
    make_layer, rank, how, jit, traced_graph
):
    layer = make_layer()
    shape = [2, 5, 3, 8][: rank - 1] + [8]
    layer(tf.zeros(shape))  # an eager call first: its cached tensors must not leak into graphs
    if how == "start_index":
        fn = lambda x, s: layer(x, start_index=s)  # noqa: E731
        extra = tf.TensorSpec([], tf.int32)
    else:
        fn = lambda x, p: layer(x, positions=p)  # noqa: E731
        extra = tf.TensorSpec([None, None], tf.int64)
    signature = [tf.TensorSpec([None, None] + shape[2:], tf.float32), extra]
    concrete = tf.function(fn, input_signature=signature, jit_compile=jit).get_concrete_function()
    op_types, dtypes = traced_graph(concrete)
    assert tf.float64 not in dtypes
    assert not op_types & {"Sin", "Cos"}, "sin/cos are recomputed in the graph"
    # Only the layer's own variables may be captured (tf2onnx would make anything else an input).
    captured = concrete.captured_inputs
    assert all(t.dtype == tf.resource for t in captured)
    assert len(captured) == len(layer.weights)


def test_tables_are_computed_once_and_shared_by_layers_of_one_configuration(monkeypatch):
    computed = []
    host_sin_cos = FrequencyTable.host_sin_cos

    def counting(self, positions):
        computed.append(len(positions))
        return host_sin_cos(self, positions)

    monkeypatch.setattr(FrequencyTable, "host_sin_cos", counting)
    # A base no other test uses, so its tables are built here for the first time.
    base = 12345.0
    x = tf.zeros((1, 5000, 12))
    first = keras_posenc.SinusoidalPositionalEncoding(base)
    first(x)
    first(x, start_index=tf.constant(70000))
    assert computed, "the host table was never computed"
    built = len(computed)
    second = keras_posenc.SinusoidalPositionalEncoding(base)
    second(x)
    second(x, positions=tf.range(5000) * 3)
    first(x, start_index=tf.constant(123456))
    assert len(computed) == built, "a second layer or call recomputed sin/cos on the host"
    assert second._table is first._table
    other = [
        keras_posenc.SinusoidalPositionalEncoding(base, layout="concat"),
        keras_posenc.SinusoidalPositionalEncoding(base + 1.0),
    ]
    for layer in other:
        layer(x)
        assert layer._table is not first._table
    narrower = keras_posenc.SinusoidalPositionalEncoding(base)
    narrower(tf.zeros((1, 5, 10)))
    assert narrower._table is not first._table


def test_rotary_layers_of_one_configuration_share_a_table():
    whole = keras_posenc.RotaryEmbedding()
    whole(tf.zeros((1, 3, 2, 8)))
    partial = keras_posenc.RotaryEmbedding(rotary_dim=8)
    partial(tf.zeros((1, 3, 2, 16)))
    attention = keras_posenc.RotaryMultiHeadAttention(num_heads=2, key_dim=8)
    attention(tf.zeros((1, 3, 4)), tf.zeros((1, 3, 4)))
    assert partial._table is whole._table
    assert attention.rotary_embedding._table is whole._table
    interleaved = keras_posenc.RotaryEmbedding(layout="interleaved")
    interleaved(tf.zeros((1, 3, 2, 8)))
    assert interleaved._table is not whole._table


def test_package_exports_the_table():
    assert keras_posenc.FrequencyTable is FrequencyTable
    assert keras_posenc.inverse_frequencies is inverse_frequencies
    assert keras.backend.backend() == "tensorflow"
