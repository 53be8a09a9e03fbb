"""One model exported to ONNX in two processes gives the same bytes (`export.tf2onnx_private`)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import onnx
from onnx import helper, numpy_helper

from keras_posenc.export.tf2onnx_private import deterministic_order, number_address_names

# A rotary attention encoder: If branches (the rotary's position check), equal constants
# that tf2onnx and the passes merge, and einsums (tf2onnx's einsum<address> constants).
EXPORT = """
import sys
import keras
from keras_posenc import RotaryMultiHeadAttention
from keras_posenc import export as kpe

keras.utils.set_random_seed(0)
tokens = keras.Input((None, 8), name="tokens")
outputs = RotaryMultiHeadAttention(num_heads=2, key_dim=4)(tokens, tokens)
kpe.save_onnx(keras.Model(tokens, outputs), sys.argv[1])
"""


def test_an_export_in_two_processes_writes_the_same_bytes(tmp_path):
    root = Path(__file__).resolve().parent.parent
    runs = []
    for seed in ("1", "2"):  # two string-hash orders, and two memory layouts
        env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": str(root)}
        path = tmp_path / seed / "model.onnx"
        path.parent.mkdir()
        command = [sys.executable, "-c", EXPORT, str(path)]
        process = subprocess.Popen(command, env=env, stderr=subprocess.PIPE, cwd=root)
        runs.append((process, path))
    for process, _ in runs:
        assert process.wait(timeout=600) == 0, process.stderr.read().decode()[-2000:]
    first, second = (path.read_bytes() for _, path in runs)
    names = {i.name for i in onnx.load_from_string(first).graph.initializer}
    assert any(name.startswith("einsum0_") for name in names), sorted(names)
    assert first == second


def _model(first_address: int, second_address: int) -> onnx.ModelProto:
    a, b = f"einsum{first_address}_ab_axes__3", f"einsum{second_address}_cd_axes__4"
    initializers = [
        helper.make_tensor(name, onnx.TensorProto.INT64, [1], [value])
        for name, value in sorted([(a, 1), (b, 2)])  # tf2onnx's order: by name, so by address
    ]
    nodes = [
        helper.make_node("Unsqueeze", ["x", a], ["y"], name="first"),
        helper.make_node("Unsqueeze", ["y", b], ["z"], name="second"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", 1, [2])],
        [helper.make_tensor_value_info("z", 1, [2, 1, 1])],
        initializers,
    )
    return helper.make_model(graph)


def test_address_names_are_numbered_in_graph_order_whatever_the_addresses():
    # The third: one address for both names (an object's id reused by the next one).
    protos = [_model(140000001, 140000002), _model(140000009, 140000002)]
    protos.append(_model(140000005, 140000005))
    for proto in protos:
        number_address_names(proto)
    low_first = protos[0]
    assert all(p.SerializeToString() == low_first.SerializeToString() for p in protos)
    assert list(low_first.graph.node[0].input) == ["x", "einsum0_ab_axes__3"]
    assert [i.name for i in low_first.graph.initializer] == [
        "einsum0_ab_axes__3",
        "einsum1_cd_axes__4",
    ]
    assert [v for i in low_first.graph.initializer for v in numpy_helper.to_array(i)] == [1, 2]


def test_a_users_name_of_that_form_is_kept():
    proto = _model(140000001, 140000002)
    proto.graph.input[0].name = "einsum2_x"
    proto.graph.node[0].input[0] = "einsum2_x"
    number_address_names(proto)
    assert proto.graph.input[0].name == proto.graph.node[0].input[0] == "einsum2_x"


def test_tf2onnx_is_itself_again_after_the_conversion():
    from tf2onnx import graph, tfonnx

    before = (graph.Graph.extract_sub_graph_nodes, tfonnx.resolve_functions)
    with deterministic_order():
        assert graph.Graph.extract_sub_graph_nodes is not before[0]
        assert tfonnx.resolve_functions is not before[1]
    assert (graph.Graph.extract_sub_graph_nodes, tfonnx.resolve_functions) == before
