"""The Erfc pass: `Erfc(x)`, which ONNX lacks, as `1 - Erf(x)`.

tf2onnx leaves `Erfc` from the exact `gelu` (`0.5·x·erfc(-x/√2)`). The difference
`1 - erf` loses erfc's relative precision where it is tiny, but not its absolute one
(float32 rounding of a value in [0, 2]), which is what the output carries.
"""

from __future__ import annotations

import onnx
from onnx import helper

from keras_posenc.export.onnx_passes.graph import Emitter, elem_type, graphs, tensor_info

__all__ = ["find_erfc", "replace_erfc"]


def find_erfc(proto: onnx.ModelProto) -> list[tuple[onnx.GraphProto, onnx.NodeProto]]:
    """`(graph, node)` of every `Erfc` of the ONNX domain (any one is rewritten: no check)."""
    return [
        (graph, node)
        for graph in graphs(proto.graph)
        for node in graph.node
        if node.op_type == "Erfc" and node.domain in ("", "ai.onnx")
    ]


def replace_erfc(proto: onnx.ModelProto) -> int:
    """Rewrites every `Erfc(x)` as `1 - Erf(x)`, in place; returns how many."""
    found = find_erfc(proto)
    info = tensor_info(proto) if found else None
    for graph, node in found:
        dtype = elem_type(info, node.input[0]) or onnx.TensorProto.FLOAT
        emit = Emitter(proto, graph, node.name + "/erfc_")
        one = emit.constant(1.0, helper.tensor_dtype_to_np_dtype(dtype))
        emit.op("Sub", [one, emit.op("Erf", [node.input[0]])], list(node.output))
        emit.insert_before(node)
        graph.node.remove(node)
    return len(found)
