"""Hand-built ONNX graphs for the tests of the graph passes: one checked model builder,
the pieces such graphs are made of, and the runtimes they are run in."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper


def model(nodes, inputs, outputs, initializers=(), opset: int = 17) -> onnx.ModelProto:
    """A checked model of one graph of `nodes` (ONNX domain, `opset`)."""
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(initializers))
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    proto.ir_version = 9
    onnx.checker.check_model(proto, full_check=True)
    return proto


def int64(name: str, value) -> onnx.TensorProto:
    """An int64 initializer named `name`."""
    return numpy_helper.from_array(np.asarray(value, np.int64), name)


def float_info(name: str, shape=None) -> onnx.ValueInfoProto:
    """A float32 graph input or output named `name`."""
    return helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, shape)


def constant(name: str, value, dtype=np.float32) -> onnx.TensorProto:
    """An initializer named `name` (float32 unless `dtype` says otherwise)."""
    return numpy_helper.from_array(np.asarray(value, dtype), name)


def if_node(condition, output, then_nodes, then_output, else_nodes, else_output, name):
    """`If(condition)` with float32 branches of `then_nodes` and `else_nodes`."""
    return helper.make_node(
        "If",
        [condition],
        [output],
        name=name,
        then_branch=helper.make_graph(then_nodes, name + "_then", [], [float_info(then_output)]),
        else_branch=helper.make_graph(else_nodes, name + "_else", [], [float_info(else_output)]),
    )


def session(proto: onnx.ModelProto):
    """An onnxruntime CPU session of `proto`, quiet: the package's own (`onnx_session`)."""
    from keras_posenc.export.verify.runtimes import onnx_session

    return onnx_session(proto)


def both_runtimes(proto: onnx.ModelProto, feeds: dict, reference: bool = True) -> list:
    """The outputs of onnxruntime and (with `reference`) of ONNX's reference evaluator."""
    from onnx.reference import ReferenceEvaluator

    outputs = [session(proto).run(None, feeds)]
    if reference:
        outputs.append(ReferenceEvaluator(proto).run(None, feeds))
    return outputs
