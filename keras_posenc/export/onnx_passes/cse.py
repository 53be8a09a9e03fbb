"""Common-subexpression elimination for ONNX graphs, `If` nodes and tensor shapes included.

onnxruntime merges identical nodes itself, but not nodes that hold subgraphs (an `If`), and
it cannot tell that `Shape(q)` and `Shape(k)` are equal when `q` and `k` are different
tensors. Both stop it from sharing what two rotations compute from the same start and the
same length: the rows, through an `If` (cached rows or split-table rows), the length read
from the shape of each projection, in one layer (the caches each fused rotation slices
from the rows) and across the blocks of a model, which each read the length anew. Here:

- two nodes of the same op, attributes and inputs are one node; a subgraph attribute is
  compared by its computation (its own tensor names do not matter, the outer names it
  reads do), so two `If` nodes on one condition with equal branches are one;
- `Constant` nodes and initializers of equal type, shape and value are one tensor;
- `Shape(a)` and `Shape(b)` are one node when `a` and `b` provably have the same shape:
  every axis has the same symbolic size (`shapes`: the queries of every block of an
  encoder are `(batch, length, heads, head_dim)` of the input's batch and length), or
  both are made by the same op with the same attributes from inputs of the same shapes
  (and the same values, for the inputs that set an output's shape: a `Reshape`'s target,
  a `Slice`'s bounds), e.g. two projections of one input by weights of one shape.

A node whose output is an output of its graph stays (the graph's outputs keep their names),
and nothing random (or holding a random node, or of a domain not known to be pure) merges.
"""

from __future__ import annotations

import onnx

from keras_posenc.export.onnx_passes.graph import (
    graphs,
    remove_unused_nodes,
    subgraphs,
    tensor_key,
)
from keras_posenc.export.onnx_passes.shapes import (
    SHAPE_FROM_SHAPES,
    SHAPE_FROM_VALUES,
    SymbolicShapes,
    constant_value,
)

__all__ = ["merge_common_subexpressions"]

_RANDOM = {
    "RandomNormal",
    "RandomNormalLike",
    "RandomUniform",
    "RandomUniformLike",
    "Multinomial",
    "Bernoulli",
    "Dropout",
}
# Domains whose ops compute functions of their inputs (no state, no side effects).
_DOMAINS = {"", "ai.onnx", "com.microsoft"}


class _Merger:
    def __init__(self, proto: onnx.ModelProto):
        self.proto = proto
        self.renamed: dict[str, str] = {}
        self.ids: dict[tuple, int] = {}  # interned keys: nested keys stay flat tuples
        self.seen: dict[int, onnx.NodeProto] = {}
        self.values: dict[tuple, str] = {}  # a constant's value -> the tensor that holds it
        self.producers: dict[str, tuple[onnx.NodeProto, int]] = {}
        self.constant_shapes: dict[str, tuple] = {}
        self.shape_ids: dict[str, int] = {}
        self.initializers: dict[str, onnx.TensorProto] = {}
        inputs = {i.name: i.type for i in proto.graph.input}
        self.shapes = SymbolicShapes(
            self.producers.get,
            lambda tensor: constant_value(tensor, self.initializers, self.producers),
            inputs.get,
        )
        self.merged = 0

    def intern(self, key: tuple) -> int:
        return self.ids.setdefault(key, len(self.ids))

    def name(self, tensor: str) -> str:
        return self.renamed.get(tensor, tensor)

    def graph(self, graph: onnx.GraphProto) -> None:
        """Merges within `graph`, after the outer graphs (whose nodes its nodes may reuse)."""
        scope: list[int] = []
        scope_values: list[tuple] = []
        returned = {o.name for o in graph.output}
        overridable = {i.name for i in graph.input}
        for initializer in list(graph.initializer):
            if initializer.name in overridable:
                continue  # a default: the input can be fed another value and shape
            key = tensor_key(initializer)
            self.constant_shapes[initializer.name] = tuple(initializer.dims)
            self.initializers[initializer.name] = initializer
            if initializer.name in returned:
                continue
            if key in self.values:
                self.renamed[initializer.name] = self.values[key]
                graph.initializer.remove(initializer)
            else:
                self.values[key] = initializer.name
                scope_values.append(key)
        for node in list(graph.node):
            node.input[:] = [self.name(i) for i in node.input]
            for attribute in node.attribute:
                for subgraph in subgraphs(attribute):
                    self.graph(subgraph)
            key = self.node_key(node) if _mergeable(node) else None
            keep = key is None or key not in self.seen or any(o in returned for o in node.output)
            if keep:
                if key is not None and key not in self.seen:
                    self.seen[key] = node
                    scope.append(key)
                for index, output in enumerate(node.output):
                    self.producers[output] = (node, index)
                for output in filter(None, node.output):
                    # Followed in graph order: a later Shape needs no deep recursion.
                    self.shapes.dims(output)
                continue
            for new, old in zip(node.output, self.seen[key].output, strict=True):
                if new:
                    self.renamed[new] = old
            graph.node.remove(node)
            self.merged += 1
        if graph is not self.proto.graph:  # a subgraph may return a tensor of an outer one
            for value in graph.output:
                value.name = self.name(value.name)
        # Leaving the subgraph: its nodes cannot serve the outer graph.
        for key in scope:
            del self.seen[key]
        for key in scope_values:
            del self.values[key]

    def node_key(self, node: onnx.NodeProto) -> int:
        attributes = tuple(sorted((a.name, self.attribute_key(a)) for a in node.attribute))
        if node.op_type == "Shape" and not node.domain:
            inputs = (("shape of", self.shape_id(node.input[0])),)
        else:
            inputs = tuple(node.input)
        return self.intern(
            (
                node.domain,
                node.op_type,
                inputs,
                attributes,
                tuple(bool(o) for o in node.output),
            )
        )

    def attribute_key(self, attribute: onnx.AttributeProto):
        if attribute.type == onnx.AttributeProto.GRAPH:
            return self.graph_key(attribute.g)
        if attribute.type == onnx.AttributeProto.GRAPHS:
            return tuple(self.graph_key(g) for g in attribute.graphs)
        if attribute.type == onnx.AttributeProto.TENSOR:
            return tensor_key(attribute.t)
        copy = onnx.AttributeProto()
        copy.CopyFrom(attribute)
        copy.ClearField("doc_string")
        return copy.SerializeToString()

    def graph_key(self, graph: onnx.GraphProto) -> int:
        """The computation of a subgraph: what each output is made of, whatever the names.

        Its own tensors are numbered by what computes them (inputs by position, constants
        by value, node outputs by op, attributes and inputs), so that two branches that
        list the same nodes in another order or under other names are equal.
        """
        local: dict[str, int] = {}
        for position, value in enumerate(graph.input):
            local[value.name] = self.intern(("input", position, value.type.SerializeToString()))
        for initializer in graph.initializer:
            local[initializer.name] = self.intern(("constant", tensor_key(initializer)))
        for node in graph.node:
            inputs = tuple(("local", local[i]) if i in local else i for i in node.input)
            attributes = tuple(sorted((a.name, self.attribute_key(a)) for a in node.attribute))
            made = (node.domain, node.op_type, inputs, attributes, len(node.output))
            for index, output in enumerate(node.output):
                if output:
                    local[output] = self.intern((*made, index))
        outputs = tuple(
            ("local", local[o.name]) if o.name in local else o.name for o in graph.output
        )
        return self.intern(("graph", outputs))

    def shape_id(self, tensor: str) -> int:
        """Equal for tensors of provably equal shapes (at any input)."""
        if tensor in self.shape_ids:
            return self.shape_ids[tensor]
        dims = self.shapes.proven_dims(tensor)
        if dims is not None:
            key = ("dims", dims)
        elif tensor in self.constant_shapes:
            key = ("constant", self.constant_shapes[tensor])
        elif tensor in self.producers:
            node, index = self.producers[tensor]
            values = SHAPE_FROM_VALUES.get(node.op_type, ())
            if node.domain or node.op_type not in SHAPE_FROM_SHAPES | set(SHAPE_FROM_VALUES):
                key = ("tensor", tensor)
            elif node.op_type == "Constant":
                key = ("tensor", tensor)
            else:
                inputs = tuple(
                    ("absent",)
                    if not name
                    else ("value", name)
                    if position in values
                    else ("shape", self.shape_id(name))
                    for position, name in enumerate(node.input)
                )
                attributes = tuple(sorted((a.name, self.attribute_key(a)) for a in node.attribute))
                key = (node.op_type, index, inputs, attributes)
        else:  # a graph input, or a tensor of an outer graph
            key = ("tensor", tensor)
        self.shape_ids[tensor] = self.intern(key)
        return self.shape_ids[tensor]


def _mergeable(node: onnx.NodeProto) -> bool:
    """Not random, of a domain whose ops are functions, and so are the nodes it holds."""
    if node.op_type in _RANDOM or node.domain not in _DOMAINS:
        return False
    return all(
        _mergeable(inner)
        for attribute in node.attribute
        for subgraph in subgraphs(attribute)
        for inner in subgraph.node
    )


def _names_unique(graph: onnx.GraphProto) -> bool:
    """Whether every tensor of `graph` and its subgraphs is made (or declared) once."""
    seen: set[str] = set()
    for inner in graphs(graph):
        names = [i.name for i in inner.input] + [t.name for t in inner.initializer]
        names = list(dict.fromkeys(names))  # an input with a default is one tensor
        names += [o for node in inner.node for o in node.output if o]
        for name in names:
            if name in seen:
                return False
            seen.add(name)
    return True


def merge_common_subexpressions(proto: onnx.ModelProto) -> int:
    """Merges the nodes of `proto` that compute the same values, in place; returns how many.

    Graph inputs and outputs keep their names; nodes nothing reads any more are removed.
    """
    if not _names_unique(proto.graph):
        # Names stand for tensors across subgraphs here (renames, shapes, outer reads):
        # a name made twice (valid in sibling branches) could stand for the wrong one.
        return 0
    merger = _Merger(proto)
    merger.graph(proto.graph)
    remove_unused_nodes(proto)
    return merger.merged
