"""The constants pass (`onnx_passes.constants`): tf2onnx's duplicated constants, merged."""

from __future__ import annotations

import copy

import hand_built
import numpy as np
from onnx import TensorProto, helper

from keras_posenc.export.onnx_passes import dedupe_constants, graph

_float, _constant = hand_built.float_info, hand_built.constant


def test_equal_constants_become_one_of_the_main_graph_and_a_shape_of_one_a_constant():
    # Each branch holds its own copy of one table; the main graph reads the shape of
    # another constant and holds one that nothing reads.
    table = np.arange(6, dtype=np.float32).reshape(2, 3)

    def branch(name, op):
        nodes = [helper.make_node(op, ["x", name + "_table"], [name + "_out"])]
        return helper.make_graph(
            nodes,
            name,
            [],
            [_float(name + "_out")],
            initializer=[_constant(name + "_table", table)],
        )

    choice = helper.make_node(
        "If", ["c"], ["rows"], then_branch=branch("then", "Add"), else_branch=branch("else", "Mul")
    )
    nodes = [
        choice,
        helper.make_node("Shape", ["kernel"], ["kernel_shape"], start=1),
        helper.make_node("Cast", ["kernel_shape"], ["width"], to=TensorProto.FLOAT),
        helper.make_node("ReduceSum", ["width"], ["total"], keepdims=0),
        helper.make_node("Add", ["rows", "total"], ["y"]),
    ]
    inputs = [_float("x", [2, 3]), helper.make_tensor_value_info("c", TensorProto.BOOL, [])]
    constants = [_constant("kernel", np.ones((4, 5))), _constant("unread", [1.0])]
    proto = hand_built.model(nodes, inputs, [_float("y", [2, 3])], constants)
    deduped = copy.deepcopy(proto)
    dedupe_constants(deduped)

    assert "Shape" not in graph.op_counts(deduped)
    (table_name,) = {i.name for i in deduped.graph.initializer} - {"kernel_shape"}
    for branch_graph in list(graph.graphs(deduped.graph))[1:]:
        assert not branch_graph.initializer
        assert branch_graph.node[0].input[1] == table_name
    x = np.ones((2, 3), np.float32)
    for c in (True, False):
        feeds = {"x": x, "c": np.array(c)}
        for (expected,), (actual,) in zip(
            hand_built.both_runtimes(proto, feeds),
            hand_built.both_runtimes(deduped, feeds),
            strict=True,
        ):
            np.testing.assert_array_equal(actual, expected)
