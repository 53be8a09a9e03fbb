"""Hand-built ONNX graphs for the tests of the graph passes: one checked model builder."""

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
