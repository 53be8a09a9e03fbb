"""Symbolic sizes (`onnx_passes.shapes`, `values`, `sizes`) and the merges of `cse` on them.

A proof of equal shapes lets every block of a model share one row lookup; a wrong proof
would give a block another length's rows. So each rule is checked both ways: sizes that
are equal at every input are proven equal, sizes that can differ (a broadcast against a
size that may be 1, a cropped sequence) are not, and the merged graphs give onnxruntime's
numbers of the unmerged ones and Keras's.
"""

from __future__ import annotations

import copy
import sys

import hand_built
import keras
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from keras_posenc import RotaryMultiHeadAttention, export
from keras_posenc.export import onnx_passes
from keras_posenc.export.onnx_passes.shapes import SymbolicShapes


def _run(proto: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    session = hand_built.session(proto)
    return session.run(None, feeds)


_model, _int64 = hand_built.model, hand_built.int64


def test_a_projection_and_a_reshape_to_heads_keep_the_input_sizes():
    # What tf2onnx makes of an EinsumDense to heads: MatMul, then a Reshape to a shape
    # gathered from the input's, then the heads' transpose.
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["projected"]),
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Gather", ["shape", "leading"], ["batch_and_length"]),
        helper.make_node("Concat", ["batch_and_length", "heads"], ["target"], axis=0),
        helper.make_node("Reshape", ["projected", "target"], ["split"]),
        helper.make_node("Transpose", ["split"], ["heads_first"], perm=[0, 2, 1, 3]),
        helper.make_node("Reshape", ["heads_first", "flat"], ["flattened"]),
        helper.make_node("Add", ["x", "bias"], ["biased"]),
    ]
    proto = _model(
        nodes,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", "s", 8])],
        [
            helper.make_tensor_value_info(n, TensorProto.FLOAT, [None] * 3)
            for n in ("flattened", "biased")
        ],
        [
            numpy_helper.from_array(np.ones((8, 16), np.float32), "w"),
            numpy_helper.from_array(np.ones((8,), np.float32), "bias"),
            _int64("leading", [0, 1]),
            _int64("heads", [2, 8]),
            _int64("flat", [-1, 0, 8]),
        ],
    )
    shapes = SymbolicShapes.of_graph(proto.graph)
    batch, length = shapes.dims("x")[:2]
    assert batch != length
    assert shapes.proven_dims("split") == (batch, length, (2, ()), (8, ()))
    assert shapes.proven_dims("heads_first") == (batch, (2, ()), length, (8, ()))
    # -1 is what is left: batch * 2 * length * 8 / (2 * 8), with axis 1 copied (the 0).
    assert shapes.proven_dims("flattened") == (
        (1, tuple(sorted(batch[1] + length[1]))),
        (2, ()),
        (8, ()),
    )
    assert shapes.proven_dims("biased") == shapes.dims("x")
    feeds = {"x": np.ones((3, 5, 8), np.float32)}
    flattened, biased = _run(proto, feeds)
    assert flattened.shape == (15, 2, 8) and biased.shape == (3, 5, 8)


def test_a_broadcast_against_a_size_that_may_be_one_proves_nothing():
    # a + b has a's length when b's is 1 and b's when a's is 1: neither Shape may stand for
    # the other's, and the merged graph must still say so at run time.
    nodes = [
        helper.make_node("Add", ["a", "b"], ["sum"]),
        helper.make_node("Shape", ["a"], ["shape_a"]),
        helper.make_node("Shape", ["sum"], ["shape_sum"]),
        helper.make_node("Identity", ["shape_a"], ["out_a"]),
        helper.make_node("Identity", ["shape_sum"], ["out_sum"]),
    ]
    proto = _model(
        nodes,
        [
            helper.make_tensor_value_info("a", TensorProto.FLOAT, [2, "s"]),
            helper.make_tensor_value_info("b", TensorProto.FLOAT, [2, "t"]),
        ],
        [helper.make_tensor_value_info(n, TensorProto.INT64, [2]) for n in ("out_a", "out_sum")],
    )
    shapes = SymbolicShapes.of_graph(proto.graph)
    assert shapes.proven_dims("sum") is None
    merged = copy.deepcopy(proto)
    onnx_passes.merge_common_subexpressions(merged)
    assert onnx_passes.op_counts(merged)["Shape"] == 2
    feeds = {"a": np.ones((2, 1), np.float32), "b": np.ones((2, 5), np.float32)}
    out_a, out_sum = _run(merged, feeds)
    assert out_a.tolist() == [2, 1] and out_sum.tolist() == [2, 5]


def test_a_broadcast_against_one_or_the_same_size_keeps_it():
    nodes = [
        helper.make_node("Mul", ["a", "row"], ["scaled"]),
        helper.make_node("Sub", ["scaled", "a"], ["difference"]),
    ]
    proto = _model(
        nodes,
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, ["b", "s", 4])],
        [helper.make_tensor_value_info("difference", TensorProto.FLOAT, [None] * 3)],
        [numpy_helper.from_array(np.ones((1, 1, 4), np.float32), "row")],
    )
    shapes = SymbolicShapes.of_graph(proto.graph)
    assert shapes.proven_dims("difference") == shapes.dims("a")


def _choices(proto: onnx.ModelProto) -> int:
    return sum(n.op_type == "If" for n in proto.graph.node)


def _blocks(crop: bool) -> keras.Model:
    x = keras.Input((None, 16), name="x")
    h = x + RotaryMultiHeadAttention(num_heads=2, key_dim=8)(x, x)
    if crop:
        h = keras.layers.Cropping1D((1, 0))(h)  # the second block sees one step fewer
    h = h + RotaryMultiHeadAttention(num_heads=2, key_dim=8)(h, h)
    return keras.Model(x, h)


def test_blocks_of_one_length_share_their_rows_and_a_cropped_block_keeps_its_own():
    rng = np.random.default_rng(0)
    for crop, choices in ((False, 1), (True, 2)):
        model = _blocks(crop)
        converted = export.onnx_model(model, rotary=None)
        before = copy.deepcopy(converted)
        onnx_passes.rewrite_rotations(before, "fused")
        proto = onnx_passes.optimized(converted, rotary="fused")
        # Each If chooses the rows of its block's length (cached or computed past them).
        assert _choices(before) == 2
        assert _choices(proto) == choices
        for length in (2, 9):
            x = rng.standard_normal((2, length, 16)).astype(np.float32)
            (actual,) = _run(proto, {"x": x})
            (unmerged,) = _run(before, {"x": x})
            np.testing.assert_array_equal(actual, unmerged)
            np.testing.assert_allclose(actual, np.asarray(model(x)), rtol=0, atol=1e-5)


def test_a_chain_deeper_than_python_recursion_merges_its_shapes():
    # Sizes are followed as the pass walks the graph, not by recursing from the last node:
    # a chain longer than Python's recursion limit, and no longer (the pass's time grows
    # faster than the chain's length).
    depth = sys.getrecursionlimit() + 200
    nodes = [
        helper.make_node("Relu", ["x" if i == 0 else f"r{i - 1}"], [f"r{i}"]) for i in range(depth)
    ]
    nodes += [
        helper.make_node("Shape", ["x"], ["shape_x"]),
        helper.make_node("Shape", [f"r{depth - 1}"], ["shape_r"]),
        helper.make_node("Concat", ["shape_x", "shape_r"], ["shapes"], axis=0),
    ]
    proto = _model(
        nodes,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 4])],
        [helper.make_tensor_value_info("shapes", TensorProto.INT64, [4])],
    )
    onnx_passes.merge_common_subexpressions(proto)
    assert onnx_passes.op_counts(proto)["Shape"] == 1
    (shapes,) = _run(proto, {"x": np.ones((3, 4), np.float32)})
    assert shapes.tolist() == [3, 4, 3, 4]
