"""Small tools for rewriting ONNX graphs in place, shared by the passes of `onnx_passes`.

Nothing here knows a pass: graphs and their subgraphs, who makes a tensor, what it holds
(`tensor_info`, `tensor_key`), names for new nodes (`Emitter`) and the removal of what
nothing reads.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator

import numpy as np
import onnx
from onnx import helper, numpy_helper


def graphs(graph: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
    """`graph` and every subgraph in it (If branches, Loop bodies), outermost first."""
    yield graph
    for node in graph.node:
        for attribute in node.attribute:
            for subgraph in subgraphs(attribute):
                yield from graphs(subgraph)


def subgraphs(attribute: onnx.AttributeProto) -> list[onnx.GraphProto]:
    """The graphs an attribute holds (none, one or several)."""
    if attribute.type == onnx.AttributeProto.GRAPH:
        return [attribute.g]
    if attribute.type == onnx.AttributeProto.GRAPHS:
        return list(attribute.graphs)
    return []


def producers(graph: onnx.GraphProto) -> dict[str, onnx.NodeProto]:
    """The node of `graph` (not of its subgraphs) that makes each tensor."""
    return {name: node for node in graph.node for name in node.output}


def tensor_key(tensor: onnx.TensorProto) -> tuple:
    """Equal for tensors of equal type, shape and value (whatever their names)."""
    value = numpy_helper.to_array(tensor)
    return (value.dtype.str, value.shape, hashlib.sha256(value.tobytes()).hexdigest())


class Emitter:
    """Appends nodes and constants for one rewrite, with names unique in the model."""

    def __init__(self, proto: onnx.ModelProto, graph: onnx.GraphProto, prefix: str):
        self.graph = graph
        self.prefix = prefix
        self.nodes: list[onnx.NodeProto] = []
        self.opset = default_opset(proto)
        self._taken = {n for g in graphs(proto.graph) for node in g.node for n in node.output}
        self._taken |= {i.name for g in graphs(proto.graph) for i in g.initializer}
        self._count = 0

    def name(self, hint: str) -> str:
        while True:
            self._count += 1
            candidate = f"{self.prefix}{hint}__{self._count}"
            if candidate not in self._taken:
                self._taken.add(candidate)
                return candidate

    def constant(self, value, dtype=np.int64) -> str:
        name = self.name("const")
        self.nodes.append(
            helper.make_node(
                "Constant",
                [],
                [name],
                name=name,
                value=numpy_helper.from_array(np.asarray(value, dtype)),
            )
        )
        return name

    def op(self, op_type: str, inputs, outputs: int | list[str] = 1, **attributes):
        names = (
            [self.name(op_type) for _ in range(outputs)] if isinstance(outputs, int) else outputs
        )
        self.nodes.append(
            helper.make_node(op_type, list(inputs), names, name=names[0] + "_node", **attributes)
        )
        return names[0] if len(names) == 1 else names

    def split_halves(self, tensor: str, axis: int) -> list[str]:
        attributes = {"num_outputs": 2} if self.opset >= 18 else {}
        return self.op("Split", [tensor], 2, axis=axis, **attributes)

    def insert_before(self, node: onnx.NodeProto) -> None:
        index = list(self.graph.node).index(node)
        for offset, new in enumerate(self.nodes):
            self.graph.node.insert(index + offset, new)


def default_opset(proto: onnx.ModelProto) -> int:
    return next(o.version for o in proto.opset_import if o.domain in ("", "ai.onnx"))


def tensor_info(proto: onnx.ModelProto) -> dict[str, onnx.TypeProto]:
    # data_prop: the head count of a reshaped projection is known only by propagating shapes.
    inferred = onnx.shape_inference.infer_shapes(proto, data_prop=True)
    return {
        v.name: v.type for g in graphs(inferred.graph) for v in [*g.input, *g.value_info, *g.output]
    }


def static_dim(info: dict, name: str, axis: int) -> int | None:
    tensor_type = info.get(name)
    if tensor_type is None or not tensor_type.tensor_type.HasField("shape"):
        return None
    dims = tensor_type.tensor_type.shape.dim
    if axis >= len(dims) or not dims[axis].HasField("dim_value"):
        return None
    return dims[axis].dim_value


def rank(info: dict, name: str) -> int | None:
    tensor_type = info.get(name)
    if tensor_type is None or not tensor_type.tensor_type.HasField("shape"):
        return None
    return len(tensor_type.tensor_type.shape.dim)


def elem_type(info: dict, name: str) -> int | None:
    tensor_type = info.get(name)
    return tensor_type.tensor_type.elem_type if tensor_type is not None else None


def remove_unused_nodes(proto: onnx.ModelProto) -> None:
    """Drops nodes and initializers nothing reads, in every graph (subgraphs read outer names)."""
    while True:
        read = {o.name for o in proto.graph.output}
        for graph in graphs(proto.graph):
            read |= {o.name for o in graph.output}
            read |= {name for node in graph.node for name in node.input}
        removed = 0
        for graph in graphs(proto.graph):
            for node in list(graph.node):
                if not any(name in read for name in node.output):
                    graph.node.remove(node)
                    removed += 1
        if not removed:
            break
    for graph in graphs(proto.graph):
        returned = {o.name for o in graph.output}
        for initializer in list(graph.initializer):
            if initializer.name not in read | returned:
                graph.initializer.remove(initializer)
    produced = {name for g in graphs(proto.graph) for n in g.node for name in n.output}
    produced |= {i.name for g in graphs(proto.graph) for i in [*g.input, *g.initializer]}
    for graph in graphs(proto.graph):
        for value in list(graph.value_info):
            if value.name not in produced:
                graph.value_info.remove(value)


def op_counts(proto: onnx.ModelProto) -> dict[str, int]:
    """How many nodes of each `domain:op_type` (plain `op_type` for ONNX's) all graphs hold."""
    counts: dict[str, int] = {}
    for graph in graphs(proto.graph):
        for node in graph.node:
            key = f"{node.domain}:{node.op_type}" if node.domain else node.op_type
            counts[key] = counts.get(key, 0) + 1
    return counts
