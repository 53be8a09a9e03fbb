"""Guards off the fast path (`onnx_passes.guards`): no `Where` on a valid run's rows.

The guarded graphs are built by hand as `keras_posenc.backend.tensorflow.nan_unless` on the rows of
a run (`keras_posenc.tables.rows`) converts (a `Where(valid, rows, NaN)` on an `If` or a lookup),
and run against the graph before in onnxruntime and in the ONNX reference evaluator (exactly, NaN
for NaN); the exports of the additive layers with a runtime start against Keras.
"""

from __future__ import annotations

import copy
import functools

import hand_built
import keras
import numpy as np
import onnx
import pytest
import reference
from float32_error import assert_within_bound, position_sum_error
from onnx import helper

from keras_posenc import LearnedPositionalEmbedding, SinusoidalPositionalEncoding, export
from keras_posenc.export import onnx_passes
from keras_posenc.frequencies import MAX_POSITIONS

WIDTH = 16

# The names the tests were written with, for the builders and runtimes of `hand_built`.
_session, _both_runtimes, _model = hand_built.session, hand_built.both_runtimes, hand_built.model
_float, _constant, _if = hand_built.float_info, hand_built.constant, hand_built.if_node


def _guarded_graph(nan_shape=()):
    """`Where(valid, If(fits){x[0:n]·2}{x·3}, NaN)` on a 1D `x`, as a layer's rows are."""
    nodes = [
        helper.make_node("Greater", ["p", "zero"], ["fits"]),
        helper.make_node("Greater", ["q", "zero"], ["valid"]),
        _if(
            "fits",
            "rows",
            [helper.make_node("Mul", ["x", "two"], ["fast"])],
            "fast",
            [helper.make_node("Mul", ["x", "three"], ["slow"])],
            "slow",
            "choice",
        ),
        helper.make_node("Where", ["valid", "rows", "nan"], ["poisoned"]),
        helper.make_node("Add", ["x", "poisoned"], ["y"]),
    ]
    initializers = [
        _constant("zero", 0.0),
        _constant("two", 2.0),
        _constant("three", 3.0),
        _constant("nan", np.full(nan_shape, np.nan)),
    ]
    inputs = [_float("x", [4]), _float("p", []), _float("q", [])]
    return _model(nodes, inputs, [_float("y", [4])], initializers)


def test_a_guarded_choice_loses_its_where_on_the_fast_path():
    proto = _guarded_graph()
    hoisted = copy.deepcopy(proto)
    assert onnx_passes.hoist_guards(hoisted) == 1
    assert onnx_passes.hoist_guards(hoisted) == 0  # done once
    onnx.checker.check_model(hoisted, full_check=True)
    (guarded,) = [n for n in hoisted.graph.node if n.op_type == "If"]
    fast = next(a.g for a in guarded.attribute if a.name == "then_branch")
    assert "Where" not in {n.op_type for n in fast.node}
    assert "Where" not in {n.op_type for n in hoisted.graph.node}
    x = np.arange(4, dtype=np.float32)
    for p in (-1.0, 1.0):
        for q in (-1.0, 1.0):
            feeds = {"x": x, "p": np.array(p, np.float32), "q": np.array(q, np.float32)}
            for expected, actual in zip(
                _both_runtimes(proto, feeds), _both_runtimes(hoisted, feeds), strict=True
            ):
                np.testing.assert_array_equal(actual[0], expected[0])
                assert np.isnan(actual[0]).all() == (q < 0)


def test_a_guarded_lookup_moves_into_a_branch_of_its_own():
    # Where(valid, x[s : s + 2], NaN), as the learned layer's rows are.
    nodes = [
        helper.make_node("Greater", ["q", "zero"], ["valid"]),
        helper.make_node("Add", ["s", "two"], ["e"]),
        helper.make_node("Slice", ["x", "s", "e"], ["rows"]),
        helper.make_node("Where", ["valid", "rows", "nan"], ["y"]),
    ]
    initializers = [
        _constant("zero", 0.0),
        _constant("two", [2], np.int64),
        _constant("nan", np.nan),
    ]
    inputs = [_float("x", [4]), _float("q", []), helper.make_tensor_value_info("s", 7, [1])]
    proto = _model(nodes, inputs, [_float("y", [2])], initializers)
    hoisted = copy.deepcopy(proto)
    assert onnx_passes.hoist_guards(hoisted) == 1
    onnx.checker.check_model(hoisted, full_check=True)
    assert [n.op_type for n in hoisted.graph.node] == ["Greater", "Add", "If"]
    (guarded,) = [n for n in hoisted.graph.node if n.op_type == "If"]
    assert guarded.input[0] == "valid"
    fast = next(a.g for a in guarded.attribute if a.name == "then_branch")
    assert [n.op_type for n in fast.node] == ["Slice"]
    x = np.arange(4, dtype=np.float32)
    for q in (-1.0, 1.0):
        for start in (0, 2):
            feeds = {"x": x, "q": np.array(q, np.float32), "s": np.array([start], np.int64)}
            for expected, actual in zip(
                _both_runtimes(proto, feeds), _both_runtimes(hoisted, feeds), strict=True
            ):
                np.testing.assert_array_equal(actual[0], expected[0])


def test_a_where_that_is_not_a_scalar_guard_stays():
    # A constant of shape (4,) is not a scalar guard (it might broadcast the rows).
    proto = _guarded_graph(nan_shape=(4,))
    assert onnx_passes.hoist_guards(proto) == 0


LAYERS = {
    "sinusoidal": lambda: SinusoidalPositionalEncoding(),
    "learned": lambda: LearnedPositionalEmbedding(100),
}


@functools.cache
def _additive(name: str):
    x = keras.Input((None, WIDTH), name="x")
    start = keras.Input((), dtype="int32", name="start", batch_size=1)
    model = keras.Model([x, start], LAYERS[name]()(x, start_index=start[0]))
    return model, export.onnx_model(model, rotary=None), export.onnx_model(model)


@pytest.mark.parametrize("name", LAYERS)
def test_a_runtime_start_has_no_where_on_the_fast_path_and_matches_keras(name):
    model, converted, exported = _additive(name)
    assert sum(n.op_type == "Where" for n in converted.graph.node) == 1
    assert "Where" not in {n.op_type for n in exported.graph.node}
    (choice,) = [n for n in exported.graph.node if n.op_type == "If"]
    fast = next(a.g for a in choice.attribute if a.name == "then_branch")
    # Nor the clamp of the start, a no-op where the run fits and is valid.
    assert not {"Where", "Min", "Max"} & {n.op_type for n in fast.node}
    limit = MAX_POSITIONS if name == "sinusoidal" else 100
    starts = [0, 4090, 70000, 16_000_000] if name == "sinusoidal" else [0, 3, 90]
    rng = np.random.default_rng(0)
    for (batch, length), start in zip([(2, 5), (1, 9), (2, 3), (1, 1)], starts, strict=False):
        x = rng.standard_normal((batch, length, WIDTH)).astype(np.float32)
        feeds = {"x": x, "start": np.array([start], np.int32)}
        (before,) = _session(converted).run(None, feeds)
        (after,) = _session(exported).run(None, feeds)
        np.testing.assert_array_equal(after, before)
        expected = np.asarray(model([x, feeds["start"]]))
        # Both float32 sums `x + row` within position_sum_error of the exact one; the
        # sinusoid's rows also against the float64 formula (the learned rows: float32 weights).
        assert_within_bound(after, expected, 2 * position_sum_error(x), what=f"start {start}")
        if name == "sinusoidal":
            exact = x + reference.sinusoidal(np.arange(start, start + length), WIDTH)
            assert_within_bound(after, exact, position_sum_error(x), what=f"start {start}")
    for start, length in [(-1, 3), (limit - 2, 3)]:  # bad runs: NaN, as before
        x = rng.standard_normal((1, length, WIDTH)).astype(np.float32)
        feeds = {"x": x, "start": np.array([start], np.int32)}
        (after,) = _session(exported).run(None, feeds)
        assert np.isnan(after).all()
