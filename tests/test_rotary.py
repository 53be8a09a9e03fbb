"""`RotaryEmbedding` (RoPE) against a float64 rotation, in both pairings, whole and partial."""

from __future__ import annotations

import itertools

import ml_dtypes
import numpy as np
import pytest
import reference
import tensorflow as tf
from float32_error import TABLE_ERROR, U, assert_within_bound, score_and_bound
from hypothesis import given
from hypothesis import strategies as st
from position_kinds import POSITION_KINDS

from keras_posenc import RotaryEmbedding
from keras_posenc.backend import tensorflow as tf_backend

# One rotation of inputs in [-1, 1] (float32_error.rotation_error): 2 (TABLE_ERROR + 3u).
ROTARY_TOLERANCE = 2 * (TABLE_ERROR + 3 * U)
LAYOUTS = ["half", "interleaved"]

# (input shape, layer arguments, reference arguments): the input forms a layer accepts.
INPUT_FORMS = {
    "heads": ((2, 7, 3, 8), {}, {}),
    "flat": ((2, 7, 12), {}, {}),
    "heads-first": ((2, 3, 7, 8), {"sequence_axis": 2}, {"sequence_axis": 2}),
    "features-before-heads": (
        (2, 7, 8, 3),
        {"feature_axis": 2},
        {"feature_axis": 2},
    ),
    "partial": ((2, 7, 3, 10), {"rotary_dim": 4}, {"rotary_dim": 4}),
}


def _uniform(shape, seed=0, dtype=np.float32):
    return np.random.default_rng(seed).uniform(-1, 1, shape).astype(dtype)


def _rotation_cases():
    """Every (layout, form, position kind) eagerly; in graphs, each kind for two of them.

    A trace (and an XLA compilation) per case costs a few tenths of a second, so the graph
    modes take a covering subset rather than the full product.
    """
    cases = []
    for index, (layout, form) in enumerate(itertools.product(LAYOUTS, INPUT_FORMS)):
        kinds = {
            "eager": POSITION_KINDS,
            "function": [POSITION_KINDS[index % len(POSITION_KINDS)]],
            "jit": [POSITION_KINDS[(index + 2) % len(POSITION_KINDS)]],
        }
        for mode, mode_kinds in kinds.items():
            cases += [
                pytest.param(mode, layout, form, kind, id=f"{mode}-{layout}-{form}-{kind}")
                for kind in mode_kinds
            ]
    return cases


@pytest.mark.parametrize(("mode", "layout", "form", "position_kind"), _rotation_cases())
def test_rotation_matches_the_formula(in_mode, positions_case, position_kind, layout, form):
    shape, layer_arguments, reference_arguments = INPUT_FORMS[form]
    sequence_axis = layer_arguments.get("sequence_axis", 1)
    case = positions_case(position_kind, shape[0], shape[sequence_axis])
    layer = RotaryEmbedding(layout=layout, **layer_arguments)
    signature = case.signature(tf.TensorSpec([None] * len(shape[:-1]) + [shape[-1]]))
    if form == "features-before-heads":
        signature[0] = tf.TensorSpec([None, None, shape[2], None])
    rotate = in_mode(case.bind(layer), signature)
    x = _uniform(shape)
    outputs = rotate(*case.arguments(x))
    assert outputs.dtype == tf.float32 and outputs.shape == shape
    expected = reference.rotary(x, case.positions, layout=layout, **reference_arguments)
    np.testing.assert_allclose(outputs, expected, rtol=0, atol=ROTARY_TOLERANCE)


@pytest.mark.parametrize("form", ["heads", "features-before-heads", "partial"])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("swap", ["gather", "concat"])
def test_both_xla_swaps_match_the_formula(monkeypatch, traced_graph, swap, layout, form):
    # Under XLA:CPU the swap is a concat below a size and a gather above it (the two also
    # take the rows of a runtime start differently); the inputs here are small, so the
    # threshold moves to put each form to the test.
    monkeypatch.setattr(
        tf_backend.rotation, "XLA_CPU_CONCAT_SWAP_BYTES", 0 if swap == "gather" else 2**40
    )
    shape, layer_arguments, reference_arguments = INPUT_FORMS[form]
    layer = RotaryEmbedding(layout=layout, **layer_arguments)
    x = _uniform(shape)
    rotate = tf.function(lambda x: layer(x, start_index=3), jit_compile=True)
    op_types, _ = traced_graph(rotate.get_concrete_function(tf.constant(x)))
    # With a static start the rows are constants of the trace: the only gather is the swap.
    assert ("GatherV2" in op_types) == (swap == "gather")
    expected = reference.rotary(x, np.arange(3, 3 + shape[1]), layout=layout, **reference_arguments)
    np.testing.assert_allclose(rotate(tf.constant(x)), expected, rtol=0, atol=ROTARY_TOLERANCE)
    rotate_from = tf.function(lambda x, s: layer(x, start_index=s), jit_compile=True)
    for start in (7, 5000):  # cached rows, computed rows
        expected = reference.rotary(
            x, np.arange(start, start + shape[1]), layout=layout, **reference_arguments
        )
        outputs = rotate_from(tf.constant(x), tf.constant(start))
        np.testing.assert_allclose(outputs, expected, rtol=0, atol=ROTARY_TOLERANCE)


def test_every_position_below_2_to_the_20(in_mode):
    chunk, width = 65536, 16
    layer = RotaryEmbedding()
    rotate = in_mode(
        lambda x, s: layer(x, start_index=s),
        [tf.TensorSpec([None, None, width]), tf.TensorSpec([], tf.int32)],
    )
    x = _uniform((1, chunk, width))
    worst = 0.0
    for start in range(0, 2**20, chunk):
        outputs = rotate(tf.constant(x), tf.constant(start)).numpy()
        expected = reference.rotary(x, np.arange(start, start + chunk))
        worst = max(worst, np.abs(outputs - expected).max())
    assert worst <= ROTARY_TOLERANCE


@pytest.mark.parametrize("layout", LAYOUTS)
def test_partial_rotation_passes_the_other_channels_through_unchanged(layout):
    x = _uniform((2, 9, 4, 10))
    outputs = RotaryEmbedding(layout=layout, rotary_dim=6)(x, start_index=1000).numpy()
    np.testing.assert_array_equal(outputs[..., 6:], x[..., 6:])
    expected = reference.rotary(x[..., :6], np.arange(1000, 1009), layout=layout)
    np.testing.assert_allclose(outputs[..., :6], expected, rtol=0, atol=ROTARY_TOLERANCE)


def test_position_zero_is_the_identity():
    x = _uniform((2, 1, 3, 8))
    np.testing.assert_array_equal(RotaryEmbedding()(x), x)
    np.testing.assert_array_equal(RotaryEmbedding(layout="interleaved")(x), x)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_scores_depend_only_on_the_relative_position(layout):
    # q_i·k_j is the same for (i, j) and (i + s, j + s).
    layer = RotaryEmbedding(layout=layout)
    query, key = _uniform((1, 1, 2, 32), seed=1), _uniform((1, 1, 2, 32), seed=2)

    def score(i, j):
        """The score (summed in float64) and how far the float32 rotations can move it."""
        rotated_query = layer(query, positions=[i]).numpy().astype(np.float64)
        rotated_key = layer(key, positions=[j]).numpy().astype(np.float64)
        return score_and_bound(query, key, rotated_query, rotated_key)

    for i, j in [(3, 7), (7, 3), (100, 100), (5000, 4000)]:
        for shift in [1, 10, 4096, 99991, 2**23]:
            (shifted, shifted_bound), (value, bound) = score(i + shift, j + shift), score(i, j)
            # Both within their bounds of the same exact score.
            assert_within_bound(shifted, value, shifted_bound + bound, what=f"{i}, {j} + {shift}")
    (a, a_bound), (b, b_bound) = score(3, 7), score(3, 8)
    assert (np.abs(a - b) > 10 * (a_bound + b_bound)).all()


@given(
    start=st.one_of(st.integers(0, 5000), st.integers(0, 2**24 - 33)),
    length=st.integers(1, 32),
    layout=st.sampled_from(LAYOUTS),
)
def test_start_index_gives_exactly_the_positions_of_its_run(start, length, layout):
    layer = RotaryEmbedding(layout=layout, rotary_dim=6)
    x = tf.constant(_uniform((2, length, 8)))
    by_positions = layer(x, positions=np.arange(start, start + length))
    np.testing.assert_array_equal(layer(x, start_index=start), by_positions)
    np.testing.assert_array_equal(layer(x, start_index=tf.constant(start)), by_positions)


def test_start_index_tensor_gives_exactly_the_positions_in_graphs(in_mode, mode):
    # Under XLA the multiply-add may be fused differently in the two graphs (an FMA in one,
    # a rounded product in the other): equal to one float32 ulp there, bitwise elsewhere.
    tolerance = 2.4e-7 if mode == "jit" else 0.0
    layer = RotaryEmbedding()
    signature = [tf.TensorSpec([None, None, 2, 8])]
    by_start = in_mode(
        lambda x, s: layer(x, start_index=s), signature + [tf.TensorSpec([], tf.int32)]
    )
    by_positions = in_mode(
        lambda x, p: layer(x, positions=p), signature + [tf.TensorSpec([None], tf.int32)]
    )
    x = tf.constant(_uniform((2, 20, 2, 8)))
    for start in [0, 4076, 4080, 4095, 4096, 9999, 2**24 - 20]:
        np.testing.assert_allclose(
            by_start(x, tf.constant(start)),
            by_positions(x, tf.range(start, start + 20)),
            rtol=0,
            atol=tolerance,
        )


def test_dynamic_sequence_length_in_one_trace(in_mode):
    layer = RotaryEmbedding()
    rotate = in_mode(lambda x: layer(x), [tf.TensorSpec([None, None, 2, 8])])
    for length in [1, 2, 4097, 5000]:
        x = _uniform((1, length, 2, 8), seed=length)
        np.testing.assert_allclose(
            rotate(tf.constant(x)),
            reference.rotary(x, np.arange(length)),
            rtol=0,
            atol=ROTARY_TOLERANCE,
        )


# --- Dtype policies ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("policy", "numpy_dtype", "mantissa_bits"),
    [
        pytest.param("mixed_bfloat16", ml_dtypes.bfloat16, 7, id="bfloat16"),
        pytest.param("mixed_float16", np.float16, 10, id="float16"),
    ],
)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_mixed_precision_rounds_the_rotation_once(policy, numpy_dtype, mantissa_bits, layout):
    layer = RotaryEmbedding(layout=layout, dtype=policy)
    x = _uniform((2, 64, 4, 16), dtype=numpy_dtype)
    start = 70000
    outputs = layer(x, start_index=start)
    assert outputs.dtype == tf.as_dtype(policy.removeprefix("mixed_"))
    exact = reference.rotary(x.astype(np.float64), np.arange(start, start + 64), layout=layout)
    reference.assert_rounded_once(outputs.numpy(), exact, mantissa_bits)


def test_float64_policy():
    layer = RotaryEmbedding(dtype="float64")
    x = np.random.default_rng(5).uniform(-1, 1, (1, 6, 8))
    outputs = layer(x, start_index=123456)
    assert outputs.dtype == tf.float64
    expected = reference.rotary(x, np.arange(123456, 123462))
    np.testing.assert_allclose(outputs, expected, rtol=0, atol=ROTARY_TOLERANCE)


# --- Errors ------------------------------------------------------------------------------


def test_odd_head_width_is_an_error_naming_it():
    with pytest.raises(ValueError, match=r"feature axis size must be even.*got 7"):
        RotaryEmbedding()(tf.zeros((1, 3, 2, 7)))


def test_odd_rotary_dim_is_an_error_naming_it():
    with pytest.raises(ValueError, match=r"rotary_dim must be even.*got 5"):
        RotaryEmbedding(rotary_dim=5)


def test_rotary_dim_wider_than_the_head_is_an_error_naming_both():
    with pytest.raises(ValueError, match=r"rotary_dim=16 is larger than the feature axis \(8\)"):
        RotaryEmbedding(rotary_dim=16)(tf.zeros((1, 3, 2, 8)))


def test_unknown_layout_is_an_error_listing_the_choices():
    with pytest.raises(ValueError, match=r"Unknown layout 'concat'.*'half', 'interleaved'"):
        RotaryEmbedding(layout="concat")


@pytest.mark.parametrize("shape", [(3, 8), (1, 2, 3, 4, 8)])
def test_wrong_input_rank_is_an_error_naming_the_shape(shape):
    with pytest.raises(ValueError, match=r"rank 3 .*or 4 .*" + r", ".join(map(str, shape))):
        RotaryEmbedding()(tf.zeros(shape))


@pytest.mark.parametrize(
    ("arguments", "pattern"),
    [
        ({"sequence_axis": 4}, r"sequence_axis=4 does not fit inputs of rank 4"),
        ({"feature_axis": -5}, r"feature_axis=-5 does not fit inputs of rank 4"),
        ({"sequence_axis": 3, "feature_axis": 1}, r"sequence axis before the feature axis"),
        ({"sequence_axis": 0}, r"after the batch axis"),
    ],
)
def test_axes_that_do_not_fit_are_errors(arguments, pattern):
    with pytest.raises(ValueError, match=pattern):
        RotaryEmbedding(**arguments)(tf.zeros((1, 3, 2, 8)))


@pytest.mark.parametrize(
    ("kwargs", "error", "pattern"),
    [
        ({"positions": tf.constant([[[0, 1, 2]]])}, ValueError, r"\(sequence,\) or \(batch"),
        ({"positions": tf.constant([0, 1])}, ValueError, r"positions cover 2 steps .* has 3"),
        ({"positions": tf.constant([0.0, 1.0, 2.0])}, TypeError, r"integers.*tf.cast"),
        ({"positions": tf.constant([0, -4, 1])}, ValueError, r">= 0.*-4"),
        ({"start_index": -1}, ValueError, r"start_index must be >= 0, got -1"),
        ({"start_index": tf.constant(-6)}, ValueError, r"start_index must be >= 0, got -6"),
        ({"start_index": 2**24}, ValueError, rf"within {2**24}"),
    ],
)
def test_bad_positions_are_errors_naming_the_value(kwargs, error, pattern):
    with pytest.raises(error, match=pattern):
        RotaryEmbedding()(tf.zeros((1, 3, 2, 8)), **kwargs)


def test_graph_mode_negative_start_index_asserts_with_the_value():
    layer = RotaryEmbedding()
    rotate = tf.function(
        lambda x, s: layer(x, start_index=s),
        input_signature=[tf.TensorSpec([None, None, 8]), tf.TensorSpec([], tf.int64)],
    )
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"start_index must be >= 0(.|\n)*-9"):
        rotate(tf.zeros((1, 4, 8)), tf.constant(-9, tf.int64))
