"""Takes the poisoning of bad positions off the fast path of a layer's rows.

A layer with a dynamic length or a runtime `start_index` gets its rows through an `If`
(the cached rows when the run fits in them, else rows computed from the split tables) or
one slice of its table, and then, because an ONNX graph cannot raise,
`Where(valid, rows, NaN)`: one more pass over the rows on every call, which costs
onnxruntime about as much as the slice itself. Here, for a scalar `valid` and a scalar
constant `K`,

    Where(valid, If(fits){T}{E}, K)  ->  If(fits & valid){T}{Where(valid, If(fits){T}{E}, K)}
    Where(valid, Slice(...), K)      ->  If(valid){Slice(...)}{Where(valid, Slice(...), K)}

(and `Gather` as `Slice`): a valid run gets its rows as they are, everything else computes
exactly what it did, so every value and every NaN is unchanged and no branch runs where it
did not run before.

The pass, in three steps: find (`_find`: each `If`, `Slice` or `Gather` read only by
`Where`s on one condition), check (in `_find` too: the condition a scalar, the other value
a scalar constant made before), rewrite (`_hoist`). What it matches is the graph of
`keras_posenc.backend.tensorflow.nan_unless` on the rows of a run (`keras_posenc.tables.rows`) as
tf2onnx converts; the tests build that graph by hand (`tests/test_onnx_guards.py`), so a change
there shows here.
The clamps the fast branch drops (`_drop_clamps`) are recognised by tensor name: the
condition's `LessOrEqual` and the branch's `Min` must read the same tensors, which holds
once `cse` has merged what both compute (hence its place after `cse` in `PASSES`).
"""

from __future__ import annotations

import copy

import onnx
from onnx import helper

from keras_posenc.export.onnx_passes.graph import (
    Emitter,
    elem_type,
    graphs,
    producers,
    rank,
    tensor_info,
)

__all__ = ["hoist_guards"]

# Ops that look rows up: where the guard is on their output alone, the lookup moves into a
# branch of its own.
_LOOKUPS = ("Slice", "Gather")

_REST = "/guarded_else"


def hoist_guards(proto: onnx.ModelProto) -> int:
    """Rewrites every guarded `If` of `proto` as the module says, in place; returns how many."""
    found = _find(proto)
    for candidate in found:
        _hoist(proto, *candidate)
    return len(found)


def _constants(proto: onnx.ModelProto, graph: onnx.GraphProto) -> dict[str, onnx.TensorProto]:
    found = {i.name: i for g in (proto.graph, graph) for i in g.initializer}
    for g in (proto.graph, graph):
        for node in g.node:
            if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
                found[node.output[0]] = node.attribute[0].t
    return found


def _find(proto: onnx.ModelProto) -> list:
    """`(graph, producer, wheres)` of every guarded choice or lookup not hoisted yet."""
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
        index = {o: position for position, node in enumerate(graph.node) for o in node.output}
        readers = {name: node for node in graph.node for name in node.input}
        constants = None
        for node in graph.node:
            if node.domain or node.op_type not in ("If", *_LOOKUPS):
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
            if rank(info, valid) != 0 or elem_type(info, node.output[0]) is None:
                continue
            found.append((graph, node, wheres, info))
    return found


def _hoist(proto, graph: onnx.GraphProto, producer: onnx.NodeProto, wheres, info) -> None:
    emit = Emitter(proto, graph, (producer.name or producer.output[0]) + "/guarded_")
    valid = wheres[0].input[0]
    if producer.op_type == "If":
        branches = {a.name: a.g for a in producer.attribute}
        condition = emit.op("And", [producer.input[0], valid])
        # The fast branch: a copy of the taken one, its own names made unique.
        fast = copy.deepcopy(branches["then_branch"])
        _rename_locals(fast, emit)
        _drop_clamps(fast, _facts(graph, [producer.input[0], valid]))
    else:  # the lookup alone, where the run is valid
        condition = valid
        lookup = copy.deepcopy(producer)
        lookup.output[0] = emit.name("rows")
        lookup.name = lookup.output[0] + "_node"
        fast = helper.make_graph(
            [lookup],
            producer.output[0] + "/guarded_then",
            [],
            [_value(lookup.output[0], info, producer.output[0])],
        )
    # The other: the whole original expression.
    rest = helper.make_graph([producer], producer.output[0] + _REST, [], [])
    for where in wheres:
        poisoned = copy.deepcopy(where)
        poisoned.output[0] = emit.name("poisoned")
        rest.node.append(poisoned)
        rest.output.append(_value(poisoned.output[0], info, where.input[1]))
    guarded = helper.make_node(
        "If",
        [condition],
        [w.output[0] for w in wheres],
        name=emit.name("If"),
        then_branch=fast,
        else_branch=rest,
    )
    emit.nodes.append(guarded)
    first = min(list(graph.node).index(w) for w in wheres)
    emit.insert_before(graph.node[first])
    for node in [producer, *wheres]:
        graph.node.remove(node)
    moved = set(producer.output)
    for value in list(graph.value_info):
        if value.name in moved:
            graph.value_info.remove(value)


def _value(name: str, info: dict, like: str) -> onnx.ValueInfoProto:
    """A subgraph output `name` of the element type of `like` (the shape left to inference)."""
    return helper.make_tensor_value_info(name, elem_type(info, like), None)


def _facts(graph: onnx.GraphProto, conditions: list[str]) -> set[tuple[str, str]]:
    """`(a, b)` for each `a <= b` that holds where every one of `conditions` does."""
    made_by = producers(graph)
    facts, pending = set(), list(conditions)
    while pending:
        node = made_by.get(pending.pop())
        if node is None or node.domain:
            continue
        if node.op_type == "And":
            pending += list(node.input)
        elif node.op_type == "LessOrEqual":
            facts.add((node.input[0], node.input[1]))
        elif node.op_type == "GreaterOrEqual":
            facts.add((node.input[1], node.input[0]))
    return facts


def _drop_clamps(branch: onnx.GraphProto, facts: set[tuple[str, str]]) -> None:
    """Removes each `Min(a, b)` with `a <= b` and `Max(a, b)` with `b <= a` known: it is `a`.

    The cached rows' start is clamped so that the slice stays valid when the branch is not
    the one taken; where it is taken (the run fits and is valid) the clamp changes nothing.
    """
    for node in list(branch.node):
        if node.op_type not in ("Min", "Max") or node.domain or len(node.input) != 2:
            continue
        a, b = node.input
        if (a, b) not in facts if node.op_type == "Min" else (b, a) not in facts:
            continue
        returned = [o for o in branch.output if o.name == node.output[0]]
        if returned:
            continue
        for other in branch.node:
            other.input[:] = [a if n == node.output[0] else n for n in other.input]
        branch.node.remove(node)
        # The result is `a` itself: a later clamp of it may go too.
        facts |= {(a, y) for x, y in list(facts) if x == node.output[0]}
        facts |= {(x, a) for x, y in list(facts) if y == node.output[0]}


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
