"""tf2onnx's private steps, replaced so that its conversion gives the same file in every process.

Two of tf2onnx's steps (1.17) iterate sets, so one model converted in two processes gives
two files that differ in names (and in which of two equal nodes its merges keep):

- `Graph.extract_sub_graph_nodes` returns a set of nodes, hashed by their ids (memory
  addresses): the graph's nodes are reset in that order, and `MergeDuplicatedNodes` keeps
  the first of equal nodes in it;
- `resolve_functions` orders each level of its topological sort of the TensorFlow
  functions (an `If`'s branches) as a set of names, hashed with the process's random
  `PYTHONHASHSEED`: the functions are converted, and their names numbered, in that order.

Its einsum rewrite also names the constants it makes `einsum<id>_...`, after the memory
address of a Python object.

`deterministic_order()` replaces the two steps, for the conversion only, with the same
steps in the graph's order and in the names' order; `number_address_names(proto)` then
numbers the addresses in the order the converted graph first uses them. The passes after
tf2onnx (`onnx_passes`) keep the first of equal tensors by graph order, so they add no other
choice.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator

import onnx

from keras_posenc.backend import tensorflow as tf_backend
from keras_posenc.export.onnx_passes.graph import graphs

__all__ = ["deterministic_order", "number_address_names"]

# tf2onnx's EinsumSubOp._onnx_name: 'einsum%d_%s' % (id(self), ...); an address has more
# than six digits, a name a user gives an input ("einsum2_x") is left alone.
_ADDRESS_NAME = re.compile(r"einsum(\d{7,})_")


def _in_graph_order(extract):
    def extract_sub_graph_nodes(self, *args, **kwargs):
        found = extract(self, *args, **kwargs)
        order = {id(node): index for index, node in enumerate(self.get_nodes())}
        return sorted(found, key=lambda node: order.get(id(node), len(order)))

    return extract_sub_graph_nodes


def _resolve_functions_by_name(tf_graph):
    """`tf2onnx.tf_loader.resolve_functions` with each level of its order sorted by name."""
    from tf2onnx import tf_loader

    *_, functions = tf_loader.tflist_to_onnx(tf_graph, {})
    dependencies = {}
    for name, definition in tf_backend.graph_functions(tf_graph).items():
        shapes = functions.get(name)
        definition = definition.definition
        if shapes and len(definition.signature.input_arg) < len(shapes):
            shapes = shapes[: len(definition.signature.input_arg)]
        try:
            function = tf_loader.function_def_to_graph(definition, input_shapes=shapes)
        except Exception:  # tf2onnx's own fallback: the function's shapes
            tf_loader.logger.warning("shape mismatch between caller and function: %s", name)
            function = tf_loader.function_def_to_graph(definition)
        tf_loader.set_function(name, function)
        *_, called = tf_loader.tflist_to_onnx(function, {})
        functions.update(called)
        dependencies[name] = set(called)
    ordered = []
    while True:
        level = sorted(name for name, needs in dependencies.items() if not needs)
        if not level:
            break
        ordered += level
        dependencies = {
            name: needs - set(level) for name, needs in dependencies.items() if name not in level
        }
    return [tf_loader._FUNCTIONS[name] for name in ordered]


@contextlib.contextmanager
def deterministic_order() -> Iterator[None]:
    """While it is open, tf2onnx converts a model to the same graph in every process."""
    from tf2onnx import graph, tfonnx

    if not hasattr(graph.Graph, "extract_sub_graph_nodes") or not hasattr(
        tfonnx, "resolve_functions"
    ):
        # Another tf2onnx than 1.17's: it converts as it does (tests/test_onnx_reproducible.py
        # says whether its files are still the same bytes).
        yield
        return
    saved = (graph.Graph.extract_sub_graph_nodes, tfonnx.resolve_functions)
    graph.Graph.extract_sub_graph_nodes = _in_graph_order(saved[0])
    tfonnx.resolve_functions = _resolve_functions_by_name
    try:
        yield
    finally:
        graph.Graph.extract_sub_graph_nodes, tfonnx.resolve_functions = saved


def number_address_names(proto: onnx.ModelProto) -> None:
    """Renames tf2onnx's `einsum<id>_...` tensors `einsum<n>_...`, in place, and orders each
    graph's initializers by name.

    n counts those names in the order the nodes first read or make them (an address can be
    reused by the next object: names, not addresses, are numbered). tf2onnx sorts the
    constants by name, so by address, before it makes them initializers: by name again,
    they are in one order. Every old name of that form is renamed, to a name of its own.
    """
    every_graph = list(graphs(proto.graph))
    named = [
        n for g in every_graph for node in g.node for n in (*node.input, *node.output, node.name)
    ]
    held = [t.name for g in every_graph for t in (*g.initializer, *g.value_info)]
    unread = sorted(held, key=_address_free)
    numbers: dict[str, str] = {}
    for name in (*named, *unread):
        if _ADDRESS_NAME.match(name):
            numbers.setdefault(name, str(len(numbers)))
    if not numbers:
        return

    def renamed(name: str) -> str:
        if name not in numbers:
            return name
        return _ADDRESS_NAME.sub(f"einsum{numbers[name]}_", name, count=1)

    for graph in every_graph:
        # The model's own inputs and outputs are the user's names (and never of that form).
        ends = () if graph is proto.graph else (*graph.input, *graph.output)
        for tensor in (*graph.initializer, *ends, *graph.value_info):
            tensor.name = renamed(tensor.name)
        for node in graph.node:
            node.name = renamed(node.name)
            node.input[:] = [renamed(name) for name in node.input]
            node.output[:] = [renamed(name) for name in node.output]
        initializers = sorted(graph.initializer, key=lambda tensor: tensor.name)
        del graph.initializer[:]
        graph.initializer.extend(initializers)


def _address_free(name: str) -> str:
    return _ADDRESS_NAME.sub("einsum_", name)
