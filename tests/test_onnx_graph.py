"""The tools the passes share (`onnx_passes.graph`)."""

from __future__ import annotations

import hand_built
import numpy as np
from onnx import TensorProto, helper

from keras_posenc.export.onnx_passes import graph

_float, _constant = hand_built.float_info, hand_built.constant


def _with_branches():
    """`y = If(c){x + one}{x·two}` and a dead `Neg`, in the main graph and a branch."""
    condition = helper.make_tensor_value_info("c", TensorProto.BOOL, [])
    choice = hand_built.if_node(
        "c",
        "y",
        [helper.make_node("Add", ["x", "one"], ["a"]), helper.make_node("Neg", ["x"], ["dead"])],
        "a",
        [helper.make_node("Mul", ["x", "two"], ["b"])],
        "b",
        "choice",
    )
    nodes = [helper.make_node("Neg", ["x"], ["unused"]), choice]
    constants = [_constant("one", 1.0), _constant("two", 2.0), _constant("three", 3.0)]
    return hand_built.model(nodes, [_float("x", [2]), condition], [_float("y", [2])], constants)


def test_graphs_are_the_main_graph_then_its_branches():
    proto = _with_branches()
    names = [g.name for g in graph.graphs(proto.graph)]
    assert names == ["g", "choice_else", "choice_then"]  # an If's attributes by name
    assert graph.op_counts(proto) == {"Neg": 2, "If": 1, "Add": 1, "Mul": 1}


def test_remove_unused_nodes_keeps_what_a_branch_reads():
    proto = _with_branches()
    graph.remove_unused_nodes(proto)
    assert graph.op_counts(proto) == {"If": 1, "Add": 1, "Mul": 1}
    # `one` and `two` are read inside the branches only; `three` by nothing.
    assert [i.name for i in proto.graph.initializer] == ["one", "two"]


def test_an_emitter_names_nothing_twice_and_inserts_in_order():
    proto = _with_branches()
    main = proto.graph
    emit = graph.Emitter(proto, main, "unused")  # the prefix of a name the graph holds
    first = emit.constant([1, 2])
    second = emit.op("Neg", ["x"])
    assert len({first, second, "unused"}) == 3
    assert second.startswith("unusedNeg__")
    emit.insert_before(main.node[1])
    assert [n.op_type for n in main.node] == ["Neg", "Constant", "Neg", "If"]
    assert graph.producers(main)[second].op_type == "Neg"


def test_tensor_keys_are_equal_for_equal_values_whatever_the_names():
    key = graph.tensor_key
    assert key(_constant("a", [1.0, 2.0])) == key(_constant("b", [1.0, 2.0]))
    assert key(_constant("a", [1.0, 2.0])) != key(_constant("a", [1.0, 2.0], np.float64))
    assert key(_constant("a", [1.0, 2.0])) != key(_constant("a", [[1.0, 2.0]]))
    assert key(_constant("a", [1.0, 2.0])) != key(_constant("a", [1.0, 3.0]))
