"""Takes the poisoning of bad positions off the fast path of a runtime choice of rows.

A layer with a runtime `start_index` gets its rows through an `If` (the cached rows when
the run fits in them, else rows computed from the split tables), and then, because an ONNX
graph cannot raise, `Where(valid, rows, NaN)`: a whole pass over the rows on every call, as
long as the Add that uses them in the sinusoidal layer. Here

    Where(valid, If(fits){T}{E}, K)  ->  If(fits & valid){T}{Where(valid, If(fits){T}{E}, K)}

for a scalar `valid` and a scalar constant `K`: a valid run that fits gets the sliced rows
as they are, and everything else computes exactly what it did, so every value and every
NaN is unchanged and no branch runs where it did not run before.
"""

from __future__ import annotations

import copy

import onnx
from onnx import helper

from keras_posenc.export.onnx_graph import Emitter, graphs, rank, tensor_info

__all__ = ["hoist_guards"]

_REST = "/guarded_else"


def hoist_guards(proto: onnx.ModelProto) -> int:
    """Rewrites every guarded `If` of `proto` as the module says, in place; returns how many."""
    found = _find(proto)
    for graph, choice, wheres in found:
        _hoist(proto, graph, choice, wheres)
    return len(found)


def _constants(proto: onnx.ModelProto, graph: onnx.GraphProto) -> dict[str, onnx.TensorProto]:
    found = {i.name: i for g in (proto.graph, graph) for i in g.initializer}
    for g in (proto.graph, graph):
        for node in g.node:
            if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
                found[node.output[0]] = node.attribute[0].t
    return found


def _find(proto: onnx.ModelProto) -> list:
    """`(graph, if_node, wheres)` of every guarded `If` not hoisted yet."""
    reads: dict[str, int] = {}
    for graph in graphs(proto.graph):
        for node in graph.node:
            for name in node.input:
                reads[name] = reads.get(name, 0) + 1
        for value in graph.output:
            reads[value.name] = reads.get(value.name, 0) + 1
    info = None
    found = []
    for graph in graphs(proto.graph):
        if graph.name.endswith(_REST):
            continue  # the original expression, already behind its fast branch
        index = {node.output[0]: position for position, node in enumerate(graph.node)}
        readers = {name: node for node in graph.node for name in node.input}
        constants = None
        for node in graph.node:
            if node.op_type != "If" or node.domain:
                continue
            wheres = [readers.get(name) for name in node.output]
            if any(
                w is None or w.op_type != "Where" or reads[r] != 1 or w.input[1] != r
                for w, r in zip(wheres, node.output, strict=True)
            ):
                continue
            valid = wheres[0].input[0]
            if any(w.input[0] != valid for w in wheres):
                continue
            constants = constants or _constants(proto, graph)
            first = min(index[w.output[0]] for w in wheres)
            if any(
                w.input[2] not in constants
                or len(constants[w.input[2]].dims) != 0
                or index.get(w.input[2], -1) >= first
                for w in wheres
            ):
                continue
            info = info or tensor_info(proto)
            if rank(info, valid) != 0:
                continue
            found.append((graph, node, wheres))
    return found


def _hoist(proto, graph: onnx.GraphProto, choice: onnx.NodeProto, wheres) -> None:
    emit = Emitter(proto, graph, choice.name + "/guarded_")
    branches = {a.name: a.g for a in choice.attribute}
    valid = wheres[0].input[0]
    both = emit.op("And", [choice.input[0], valid])
    # The fast branch: a copy of the taken one, its own names made unique.
    fast = copy.deepcopy(branches["then_branch"])
    _rename_locals(fast, emit)
    # The other: the whole original expression.
    rest = helper.make_graph([], choice.name + _REST, [], [])
    rest.node.append(choice)
    for where, value in zip(wheres, branches["else_branch"].output, strict=True):
        poisoned = copy.deepcopy(where)
        poisoned.output[0] = emit.name("poisoned")
        rest.node.append(poisoned)
        output = copy.deepcopy(value)
        output.name = poisoned.output[0]
        rest.output.append(output)
    guarded = helper.make_node(
        "If",
        [both],
        [w.output[0] for w in wheres],
        name=emit.name("If"),
        then_branch=fast,
        else_branch=rest,
    )
    emit.nodes.append(guarded)
    first = min(list(graph.node).index(w) for w in wheres)
    emit.insert_before(graph.node[first])
    for node in [choice, *wheres]:
        graph.node.remove(node)
    moved = set(choice.output)
    for value in list(graph.value_info):
        if value.name in moved:
            graph.value_info.remove(value)


def _rename_locals(graph: onnx.GraphProto, emit: Emitter) -> None:
    """Gives every tensor `graph` (and its subgraphs) defines a new name, in place."""
    new: dict[str, str] = {}
    for g in graphs(graph):
        for value in [*g.input, *g.initializer]:
            new[value.name] = emit.name("local")
        for node in g.node:
            for output in node.output:
                if output:
                    new[output] = emit.name("local")
    for g in graphs(graph):
        for value in [*g.input, *g.initializer, *g.output, *g.value_info]:
            value.name = new.get(value.name, value.name)
        for node in g.node:
            node.input[:] = [new.get(n, n) for n in node.input]
            node.output[:] = [new.get(n, n) for n in node.output]
            if node.name:
                node.name = emit.name("node")
