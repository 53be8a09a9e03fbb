"""Common subexpressions (`onnx_passes.cse`): what is computed twice is computed once.

The merges must leave every value as it was: the graphs are run against the graph before
in onnxruntime and in the ONNX reference evaluator (exactly, NaN for NaN), and the exports
against Keras. The structure they promise is counted: one row computation per attention
layer.
"""

from __future__ import annotations

import copy
import functools

import hand_built
import keras
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from keras_posenc import RotaryMultiHeadAttention, export
from keras_posenc.export import onnx_passes

WIDTH = 16

# The names the tests were written with, for the builders and runtimes of `hand_built`.
_session, _both_runtimes, _model = hand_built.session, hand_built.both_runtimes, hand_built.model
_float, _constant, _if = hand_built.float_info, hand_built.constant, hand_built.if_node


# ---------------------------------------------------------------------------------------
# Common subexpressions


@functools.cache
def _encoder(blocks: int = 2):
    x = keras.Input((None, WIDTH), name="x")
    h = x
    for _ in range(blocks):
        normed = keras.layers.LayerNormalization()(h)
        h = h + RotaryMultiHeadAttention(num_heads=2, key_dim=WIDTH // 2)(normed, normed)
        h = h + keras.layers.Dense(WIDTH)(keras.layers.Dense(2 * WIDTH, activation="gelu")(h))
    model = keras.Model(x, h)
    return model, export.onnx_model(model, rotary=None)


def _row_choices(proto: onnx.ModelProto) -> int:
    return sum(n.op_type == "If" for n in proto.graph.node)


@pytest.mark.parametrize("rotary", ["fused", "decomposed"])
def test_each_attention_layer_computes_its_rows_once(rotary):
    model, converted = _encoder()
    unshared = copy.deepcopy(converted)
    onnx_passes.rewrite_rotations(unshared, rotary)
    proto = onnx_passes.optimized(copy.deepcopy(converted), rotary=rotary)
    # The layer rotates queries and keys with one lookup: one choice of rows per block.
    # A fused rotation keeps its input's shape, so the pass proves that both blocks see
    # the input's length (onnx_shapes) and the two blocks' choices become one.
    assert _row_choices(unshared) == 2
    assert _row_choices(proto) == (1 if rotary == "fused" else 2)
    counts = onnx_passes.op_counts(proto)
    if rotary == "fused":
        kernels = [n for n in proto.graph.node if n.op_type == "RotaryEmbedding"]
        assert len(kernels) == 4
        # Each rewritten rotation slices its own caches from the rows; merged, every
        # rotation of the encoder reads the same ones.
        before = {tuple(n.input[2:]) for n in unshared.graph.node if n.op_type == "RotaryEmbedding"}
        assert len(before) == 4
        assert len({tuple(k.input[2:]) for k in kernels}) == 1
    else:
        assert not {"ReverseSequence", "Transpose"} & {
            n.op_type
            for n in proto.graph.node
            if n.input and n.input[0] in {r.x for r in onnx_passes.find_rotations(converted)}
        }
        assert "ReverseSequence" not in counts
    rng = np.random.default_rng(0)
    for batch, length in [(1, 1), (2, 9)]:
        feeds = {"x": rng.standard_normal((batch, length, WIDTH)).astype(np.float32)}
        # Each runtime against itself; the standard-op graph also runs in the reference evaluator.
        reference = rotary == "decomposed"
        for (expected,), (actual,) in zip(
            _both_runtimes(unshared, feeds, reference),
            _both_runtimes(proto, feeds, reference),
            strict=True,
        ):
            np.testing.assert_allclose(actual, expected, rtol=0, atol=1e-6)
        np.testing.assert_allclose(actual, np.asarray(model(feeds["x"])), rtol=0, atol=1e-5)


def test_ifs_with_equal_branches_in_another_order_and_names_merge():
    def branch(prefix, order):
        nodes = [
            helper.make_node("Mul", ["x", "two"], [prefix + "a"]),
            helper.make_node("Add", ["x", "one"], [prefix + "b"]),
        ][::order]
        return [*nodes, helper.make_node("Sub", [prefix + "a", prefix + "b"], [prefix + "c"])]

    nodes = [
        helper.make_node("ReduceSum", ["x"], ["total"], keepdims=0),
        helper.make_node("Greater", ["total", "zero"], ["positive"]),
        _if(
            "positive",
            "y1",
            branch("t1", 1),
            "t1c",
            [helper.make_node("Neg", ["x"], ["e1"])],
            "e1",
            "if1",
        ),
        _if(
            "positive",
            "y2",
            branch("t2", -1),
            "t2c",
            [helper.make_node("Neg", ["x"], ["e2"])],
            "e2",
            "if2",
        ),
        # A third whose else branch differs: it stays.
        _if(
            "positive",
            "y3",
            branch("t3", 1),
            "t3c",
            [helper.make_node("Abs", ["x"], ["e3"])],
            "e3",
            "if3",
        ),
        helper.make_node("Add", ["y1", "y2"], ["s"]),
        helper.make_node("Add", ["s", "y3"], ["y"]),
    ]
    initializers = [_constant("one", 1.0), _constant("two", 2.0), _constant("zero", 0.0)]
    proto = _model(nodes, [_float("x", [3])], [_float("y", [3])], initializers)
    merged = copy.deepcopy(proto)
    assert onnx_passes.merge_common_subexpressions(merged) == 1
    onnx.checker.check_model(merged, full_check=True)
    assert [n.name for n in merged.graph.node if n.op_type == "If"] == ["if1", "if3"]
    assert [o.name for o in merged.graph.output] == ["y"]
    for x in ([1.0, 2.0, 3.0], [-1.0, -2.0, 0.5]):
        feeds = {"x": np.array(x, np.float32)}
        for expected, actual in zip(
            _both_runtimes(proto, feeds), _both_runtimes(merged, feeds), strict=True
        ):
            np.testing.assert_array_equal(actual[0], expected[0])


def _shape_graph(second_weight_shape, second_target=None):
    """`Shape(x·W1)` and `Shape(x·W2)` (optionally reshaped to targets), concatenated."""
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["p1"]),
        helper.make_node("MatMul", ["x", "w2"], ["p2"]),
        helper.make_node("Reshape", ["p1", "target1"], ["r1"]),
        helper.make_node("Reshape", ["p2", "target2"], ["r2"]),
        helper.make_node("Shape", ["r1"], ["s1"]),
        helper.make_node("Shape", ["r2"], ["s2"]),
        helper.make_node("Concat", ["s1", "s2"], ["y"], axis=0),
    ]
    initializers = [
        _constant("w1", np.ones((4, 6))),
        _constant("w2", np.ones(second_weight_shape)),
        _constant("target1", [0, -1, 2], np.int64),
        _constant("target2", second_target or [0, -1, 2], np.int64),
    ]
    y = helper.make_tensor_value_info("y", TensorProto.INT64, [6])
    return _model(nodes, [_float("x", ["b", 4])], [y], initializers)


@pytest.mark.parametrize(
    "weight, target, shapes",
    [
        ((4, 6), None, 1),  # equal shapes: one Shape
        ((4, 8), None, 2),  # another weight shape
        ((4, 6), [0, 2, -1], 2),  # another reshape target
    ],
)
def test_shapes_of_tensors_of_provably_equal_shape_merge(weight, target, shapes):
    proto = _shape_graph(weight, target)
    merged = copy.deepcopy(proto)
    onnx_passes.merge_common_subexpressions(merged)
    onnx.checker.check_model(merged, full_check=True)
    assert onnx_passes.op_counts(merged)["Shape"] == shapes
    feeds = {"x": np.ones((3, 4), np.float32)}
    for expected, actual in zip(
        _both_runtimes(proto, feeds), _both_runtimes(merged, feeds), strict=True
    ):
        np.testing.assert_array_equal(actual[0], expected[0])


def test_random_nodes_outputs_and_inner_nodes_stay():
    nodes = [
        helper.make_node("RandomUniformLike", ["x"], ["u1"], seed=1.0),
        helper.make_node("RandomUniformLike", ["x"], ["u2"], seed=1.0),
        helper.make_node("Add", ["x", "one"], ["a"]),
        helper.make_node("Add", ["x", "one"], ["b"]),  # a graph output: stays
        helper.make_node("ReduceSum", ["x"], ["total"], keepdims=0),
        helper.make_node("Greater", ["total", "one"], ["big"]),
        _if(
            "big",
            "c",
            [
                helper.make_node("Add", ["x", "one"], ["inner"]),  # reuses `a`
                helper.make_node("Neg", ["inner"], ["inner_out"]),
            ],
            "inner_out",
            [
                helper.make_node("Mul", ["x", "one"], ["other"]),
                helper.make_node("Neg", ["other"], ["other_out"]),
            ],
            "other_out",
            "if",
        ),
        helper.make_node("Mul", ["x", "one"], ["after"]),  # cannot reuse the branch's
        # Equal Ifs that draw random numbers stay two.
        _if(
            "big",
            "d1",
            [helper.make_node("RandomUniformLike", ["x"], ["r1"])],
            "r1",
            [helper.make_node("Neg", ["x"], ["n1"])],
            "n1",
            "random1",
        ),
        _if(
            "big",
            "d2",
            [helper.make_node("RandomUniformLike", ["x"], ["r2"])],
            "r2",
            [helper.make_node("Neg", ["x"], ["n2"])],
            "n2",
            "random2",
        ),
        helper.make_node("Sum", ["u1", "u2", "a", "c", "after", "d1", "d2"], ["y"]),
    ]
    proto = _model(
        nodes,
        [_float("x", [2])],
        [_float("y", [2]), _float("b", [2])],
        [_constant("one", 1.0)],
    )
    merged = copy.deepcopy(proto)
    onnx_passes.merge_common_subexpressions(merged)
    onnx.checker.check_model(merged, full_check=True)
    counts = onnx_passes.op_counts(merged)
    assert counts["RandomUniformLike"] == 4
    assert counts["If"] == 3
    assert [o.name for o in merged.graph.output] == ["y", "b"]
    outer = [n.op_type for n in merged.graph.node]
    assert outer.count("Add") == 2 and outer.count("Mul") == 1
    (choice,) = [n for n in merged.graph.node if n.name == "if"]
    branches = {a.name: [n.op_type for n in a.g.node] for a in choice.attribute}
    assert branches == {"then_branch": ["Neg"], "else_branch": ["Mul", "Neg"]}
    feeds = {"x": np.array([0.0, 5.0], np.float32)}
    (y, b), (merged_y, merged_b) = (
        _session(proto).run(None, feeds),
        _session(merged).run(None, feeds),
    )
    np.testing.assert_array_equal(merged_b, b)
    # The random draws differ run to run; the rest of the sum does not.
    assert merged_y.shape == y.shape
