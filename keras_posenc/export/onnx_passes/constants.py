"""The constants pass: the duplicated constants tf2onnx leaves, merged.

- `Shape` of an initializer becomes an initializer: tf2onnx keeps each einsum kernel a
  second time, reshaped, only to read its shape;
- identical initializers (`graph.tensor_key`, the key `cse` merges constants by), in any
  subgraph, become one initializer of the main graph, which subgraphs read by name: every
  traced use of a host position table is its own constant, inside the branches of an `If`;
- initializers nothing reads are removed.

It runs on every conversion (rotary or not): `PASSES`' step `constants`.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper

from keras_posenc.export.onnx_passes.graph import graphs, tensor_key

__all__ = ["dedupe_constants"]


def dedupe_constants(proto: onnx.ModelProto) -> int:
    """Removes the duplicated constants tf2onnx leaves, in place.

    Returns:
        How many `Shape` nodes became initializers and initializers were removed.
    """
    every_graph = list(graphs(proto.graph))
    changes = _fold_shapes_of_initializers(every_graph)
    canonical: dict[tuple, str] = {}
    renamed: dict[str, str] = {}
    for graph in every_graph:
        # A subgraph must produce its outputs itself: constants it returns stay where they are.
        returned = {o.name for o in graph.output}
        for initializer in list(graph.initializer):
            if initializer.name in returned:
                continue
            key = tensor_key(initializer)
            if key in canonical:
                renamed[initializer.name] = canonical[key]
                graph.initializer.remove(initializer)
                changes += 1
            else:
                canonical[key] = initializer.name
                if graph is not proto.graph:
                    graph.initializer.remove(initializer)
                    proto.graph.initializer.append(initializer)
    for graph in every_graph:
        for node in graph.node:
            for index, name in enumerate(node.input):
                node.input[index] = renamed.get(name, name)

    read = {name for g in every_graph for node in g.node for name in node.input}
    for graph in every_graph:
        returned = {o.name for o in graph.output}
        for initializer in list(graph.initializer):
            if initializer.name not in read | returned:
                graph.initializer.remove(initializer)
                changes += 1
    return changes


def _fold_shapes_of_initializers(every_graph: list[onnx.GraphProto]) -> int:
    initializers = {i.name: i for g in every_graph for i in g.initializer}
    folded = 0
    for graph in every_graph:
        for node in list(graph.node):
            if node.op_type == "Shape" and node.input[0] in initializers:
                dims = list(initializers[node.input[0]].dims)
                bounds = {a.name: a.i for a in node.attribute}
                shape = dims[bounds.get("start", 0) : bounds.get("end", len(dims))]
                graph.node.remove(node)
                graph.initializer.append(
                    numpy_helper.from_array(np.array(shape, np.int64), node.output[0])
                )
                folded += 1
    return folded
