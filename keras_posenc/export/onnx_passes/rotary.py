"""The rotary pass: each rotation `RotaryEmbedding` marked, as a kernel or lean standard ops.

tf2onnx turns a rotation's channel swap into whole-tensor data movement (a Transpose,
ReverseSequence and Transpose for the reshape-and-reverse form). The layer puts each
rotation's ops under a name scope (`keras_posenc.layers.rotation_scope`, the one definition the
layer and this pass share), which survives into the ONNX node names. The pass, in three steps:

- find (`find_rotations`): every `Add` in a rotation scope that is `x·C + swap(x)·S`;
- check (`check_rotations`): every rotation scope the graph holds was found, once (else
  `RotationMismatch`: a rotation left as tf2onnx wrote it is slow, not wrong, but nothing
  would say so), and which form each rotation can take (`kernel_fits`);
- rewrite (`rewrite_rotations`, which runs all three and returns the count), as `form`:
  - `"fused"`: one `com.microsoft.RotaryEmbedding` node (onnxruntime's kernel, opset <= 22);
  - `"standard"`: the ONNX `RotaryEmbedding` of opset 23 (convert the model first);
  - `"decomposed"`: standard ops only, the swap as a Split and a Concat along the channels.

The rotation's rows are whatever the graph computed for this call (a slice of the cached
table, the split-table path past it, the `If` between them for a runtime start, the switch
of dynamic / longrope scaling): the kernel gets exactly those rows as its cache, with
position ids that index them, so every position below 2^24 stays as exact as in Keras and
no 2^24-row cache is stored. The graph's inputs and outputs do not change.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx
from onnx import helper

from keras_posenc.export.onnx_passes.graph import (
    Emitter,
    default_opset,
    elem_type,
    graphs,
    producers,
    rank,
    remove_unused_nodes,
    static_dim,
    tensor_info,
)
from keras_posenc.layers.rotation_scope import read_rotation_scope

__all__ = [
    "FORMS",
    "MICROSOFT_DOMAIN",
    "STANDARD_ROTARY_OPSET",
    "Rotation",
    "RotationMismatch",
    "check_rotations",
    "find_rotations",
    "kernel_fits",
    "marked_scopes",
    "rewrite_rotations",
]

FORMS = ("fused", "standard", "decomposed")
MICROSOFT_DOMAIN = "com.microsoft"
STANDARD_ROTARY_OPSET = 23

# Ops that only move or select values: the swap of a rotation is made of these.
_MOVES = {
    "Reshape",
    "Transpose",
    "ReverseSequence",
    "Split",
    "Concat",
    "Slice",
    "Gather",
    "Squeeze",
    "Unsqueeze",
    "Identity",
    "Cast",
}
# The products and the sum of `x·C + swap(x)·S`: a scope holding one holds a rotation.
_ARITHMETIC = {"Mul", "Add"}
_KERNEL_TYPES = {onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16}


class RotationMismatch(ValueError):
    """The graph marks rotations that `find_rotations` does not find as rotations."""


@dataclasses.dataclass
class Rotation:
    """One rotation `y = x·C + swap(x)·S` found in a graph, by tensor names."""

    graph: onnx.GraphProto
    add: onnx.NodeProto  # produces y
    swap_mul: onnx.NodeProto  # swap(x)·S
    x: str
    cos_table: str  # C, broadcastable against x
    sin_table: str  # S, signed
    layout: str
    rank: int
    sequence_axis: int
    feature_axis: int
    per_batch: bool  # rows per batch row (positions of shape (batch, sequence))
    scope: str = ""  # the node name up to the end of its rotation scope


# -- find --------------------------------------------------------------------------------


def _moved_from(name: str, made_by: dict, depth: int = 12) -> set[str]:
    """Every tensor `name` is made from through data-movement ops only (itself included)."""
    found, frontier = {name}, [name]
    for _ in range(depth):
        following = []
        for tensor in frontier:
            node = made_by.get(tensor)
            if node is None or node.op_type not in _MOVES:
                continue
            sources = node.input if node.op_type == "Concat" else node.input[:1]
            following += [s for s in sources if s and s not in found]
        found.update(following)
        frontier = following
    return found


def find_rotations(proto: onnx.ModelProto) -> list[Rotation]:
    """The rotations `RotaryEmbedding` marked in `proto`'s graphs."""
    rotations = []
    for graph in graphs(proto.graph):
        made_by = producers(graph)
        for node in graph.node:
            scope = read_rotation_scope(node.name)
            if node.op_type != "Add" or scope is None:
                continue
            muls = [made_by.get(name) for name in node.input]
            if any(m is None or m.op_type != "Mul" for m in muls):
                continue
            found = _split_rotation(muls, made_by)
            if found is None:
                continue
            x, swap_mul, cos_table, sin_table = found
            rotations.append(
                Rotation(
                    graph,
                    node,
                    swap_mul,
                    x,
                    cos_table,
                    sin_table,
                    scope.layout,
                    scope.rank,
                    scope.sequence_axis,
                    scope.feature_axis,
                    scope.per_batch,
                    scope.prefix,
                )
            )
    return rotations


def _split_rotation(muls, made_by):
    """`(x, swap_mul, C, S)` of `x·C + swap(x)·S`, or None if the Muls are not that."""
    for cos_mul, swap_mul in (muls, muls[::-1]):
        for i in (0, 1):
            for j in (0, 1):
                x, swapped = cos_mul.input[i], swap_mul.input[j]
                if swapped != x and x in _moved_from(swapped, made_by):
                    return x, swap_mul, cos_mul.input[1 - i], swap_mul.input[1 - j]
    return None


# -- check -------------------------------------------------------------------------------


def marked_scopes(proto: onnx.ModelProto) -> list[tuple[int, str]]:
    """`(graph number, scope)` of every rotation scope that still holds a `Mul` or `Add`.

    One per rotation the layers traced (TensorFlow makes a scope entered again unique). A
    rotation rewritten as a kernel holds neither any more; one decomposed keeps both.
    """
    found = {}
    for number, graph in enumerate(graphs(proto.graph)):
        for node in graph.node:
            scope = read_rotation_scope(node.name)
            if scope is not None and node.op_type in _ARITHMETIC and not node.domain:
                found[(number, scope.prefix)] = None
    return list(found)


def check_rotations(proto: onnx.ModelProto, rotations: list[Rotation]) -> None:
    """Raises `RotationMismatch` unless `rotations` are the marked scopes, one each."""
    number = {id(graph): n for n, graph in enumerate(graphs(proto.graph))}
    found = [(number[id(r.graph)], r.scope) for r in rotations]
    marked = marked_scopes(proto)
    if sorted(found) == sorted(marked):
        return
    missed = sorted(scope for _, scope in set(marked) - set(found))
    raise RotationMismatch(
        f"The graph marks {len(marked)} rotation(s) and {len(found)} were found as "
        f"x·C + swap(x)·S; not found: {missed or 'none'}. tf2onnx wrote a rotation in a "
        "form this pass does not know: it would be left as converted (correct, with the "
        "whole-tensor swap). Report it with the model; rotary=None exports it as converted."
    )


def kernel_fits(rotation: Rotation, info: dict) -> bool:
    """Whether a `RotaryEmbedding` kernel takes `rotation`: channels last, heads after the
    sequence axis or (batch, heads, sequence, channels), a float32 / float16 input."""
    return (
        rotation.feature_axis == rotation.rank - 1
        and (rotation.rank, rotation.sequence_axis) in ((3, 1), (4, 1), (4, 2))
        and elem_type(info, rotation.x) in _KERNEL_TYPES
    )


def _check_form(proto: onnx.ModelProto, form: str) -> None:
    if form not in FORMS:
        raise ValueError(f"Unknown rotary form {form!r}; expected one of {FORMS}.")
    if form == "standard" and default_opset(proto) < STANDARD_ROTARY_OPSET:
        raise ValueError(
            f"The ONNX RotaryEmbedding needs opset {STANDARD_ROTARY_OPSET}; the model has "
            f"{default_opset(proto)}. Convert it first: to_opset(proto, {STANDARD_ROTARY_OPSET})."
        )
    if form == "fused" and default_opset(proto) >= STANDARD_ROTARY_OPSET:
        raise ValueError(
            "onnxruntime's com.microsoft.RotaryEmbedding is for opsets below "
            f"{STANDARD_ROTARY_OPSET}; at opset {default_opset(proto)} use form='standard'."
        )


# -- rewrite -----------------------------------------------------------------------------


def rewrite_rotations(proto: onnx.ModelProto, form: str = "fused") -> int:
    """Rewrites every marked rotation of `proto` in place as `form`; returns how many.

    `form` is one of `FORMS`. A rotation the kernel cannot take (`kernel_fits`) gets the
    decomposed form instead. `"standard"` needs a model of opset `STANDARD_ROTARY_OPSET`
    or later (`onnx_passes.to_opset`). Raises `RotationMismatch` if a marked rotation is
    not found (`check_rotations`).
    """
    _check_form(proto, form)
    rotations = find_rotations(proto)
    check_rotations(proto, rotations)
    if not rotations:
        return 0
    info = tensor_info(proto)
    uses_kernel = False
    for rotation in rotations:
        if form != "decomposed" and kernel_fits(rotation, info):
            _fuse(proto, rotation, info, standard=form == "standard")
            uses_kernel = True
        else:
            _decompose(proto, rotation, info)
    if uses_kernel and form == "fused":
        if not any(o.domain == MICROSOFT_DOMAIN for o in proto.opset_import):
            proto.opset_import.append(helper.make_opsetid(MICROSOFT_DOMAIN, 1))
    remove_unused_nodes(proto)
    return len(rotations)


def _fuse(proto: onnx.ModelProto, rotation: Rotation, info: dict, standard: bool) -> None:
    emit = Emitter(proto, rotation.graph, rotation.add.name + "/fused_")
    x, output = rotation.x, rotation.add.output[0]
    interleaved = rotation.layout == "interleaved"
    # The rows this call rotates with, one per (batch row,) position: (rows, rotary_dim).
    rows = [_row_table(emit, rotation, t, info) for t in (rotation.cos_table, rotation.sin_table)]
    cos, sin = _kernel_halves(emit, rotation, rows, info)
    shape = emit.op("Shape", [x])
    if rotation.rank == 4 and rotation.sequence_axis == 1:
        # (batch, sequence, heads, channels) -> (batch, sequence, heads·channels): no copy.
        kernel_input = emit.op("Reshape", [x, emit.constant([0, 0, -1])])
    else:
        kernel_input = x
    attributes = {"interleaved": int(interleaved)}
    if standard:
        caches = _standard_caches(emit, rotation, shape, cos, sin)
        # A 3D input needs the number of heads: 1 for (batch, sequence, channels).
        if rotation.rank == 3:
            attributes["num_heads"] = 1
        elif kernel_input is not x:
            heads = static_dim(info, x, 2)
            if heads is None:
                _decompose(proto, rotation, info)
                return
            attributes["num_heads"] = heads
        rotated = emit.op("RotaryEmbedding", [kernel_input, *caches], **attributes)
    else:
        ids = _position_ids(emit, rotation, shape, rows[0])
        rotated = emit.op(
            "RotaryEmbedding", [kernel_input, ids, cos, sin], domain=MICROSOFT_DOMAIN, **attributes
        )
    if kernel_input is not x:
        emit.op("Reshape", [rotated, shape], [output])
    else:
        emit.nodes[-1].output[0] = output
    emit.insert_before(rotation.add)
    rotation.graph.node.remove(rotation.add)


def _kernel_halves(emit: Emitter, rotation: Rotation, rows: list[str], info: dict):
    """The kernel's `(cos, sin)` caches, `(rows, rotary_dim / 2)`, from the rows of C and S."""
    if rotation.layout == "interleaved":
        # C repeats cos over each pair (c, c); S holds (-s, s).
        cos = emit.op("Slice", [rows[0], *map(emit.constant, ([0], [2**62], [1], [2]))])
        sin = emit.op("Slice", [rows[1], *map(emit.constant, ([1], [2**62], [1], [2]))])
        return cos, sin
    # C is (cos, cos) along the channels, S is (-sin, sin).
    width = static_dim(info, rotation.x, rotation.feature_axis)
    if width is None:
        return emit.split_halves(rows[0], 1)[0], emit.split_halves(rows[1], 1)[1]
    half = width // 2  # a slice makes only the half it keeps
    cos = emit.op("Slice", [rows[0], *map(emit.constant, ([0], [half], [1]))])
    sin = emit.op("Slice", [rows[1], *map(emit.constant, ([half], [width], [1]))])
    return cos, sin


def _sequence_length(emit: Emitter, rotation: Rotation, shape: str) -> str:
    axis = rotation.sequence_axis
    return emit.op("Slice", [shape, emit.constant([axis]), emit.constant([axis + 1])])


def _standard_caches(emit: Emitter, rotation: Rotation, shape: str, cos: str, sin: str):
    """The ONNX kernel's caches: rows per (batch, position), no position ids:
    `(batch, sequence, rotary_dim / 2)`."""
    sequence = _sequence_length(emit, rotation, shape)
    batch = emit.op("Slice", [shape, emit.constant([0]), emit.constant([1])])
    row_shape = emit.op("Concat", [emit.constant([-1]), sequence, emit.constant([0])], axis=0)
    full_shape = emit.op(
        "Concat", [batch, sequence, emit.constant([1])], axis=0
    )  # Expand broadcasts the 1 to rotary_dim / 2
    caches = []
    for table in (cos, sin):
        leading = emit.op("Unsqueeze", [table, emit.constant([0])])
        three = emit.op("Reshape", [leading, row_shape])
        caches.append(emit.op("Expand", [three, full_shape]))
    return caches


def _position_ids(emit: Emitter, rotation: Rotation, shape: str, rows: str) -> str:
    """onnxruntime's kernel's position ids into `rows`, which are this call's."""
    if not rotation.per_batch:
        # One id: the offset of the first position into the rows.
        return emit.constant([0])
    # Row b·sequence + i serves position i of batch row b.
    sequence = _sequence_length(emit, rotation, shape)
    count = emit.op(
        "Squeeze",
        [emit.op("Slice", [emit.op("Shape", [rows]), *map(emit.constant, ([0], [1]))])],
    )
    ids = emit.op("Range", [emit.constant(0), count, emit.constant(1)])
    ids_shape = emit.op("Concat", [emit.constant([-1]), sequence], axis=0)
    return emit.op("Reshape", [ids, ids_shape])


def _row_table(emit: Emitter, rotation: Rotation, table: str, info: dict) -> str:
    """`table` as `(rows, rotary_dim)`.

    For `(batch, sequence, heads, D)` inputs `RotaryEmbedding` reshapes its `(sequence, D)`
    rows to broadcast: a 2D input of that reshape, `D` wide, serves as it is and the
    reshape goes. Anything else is flattened: tf2onnx merges consecutive reshapes, so the
    input of the one before the product may be the rows in another arrangement.
    """
    producer = next((n for n in emit.graph.node if table in n.output), None)
    # Rows of a fixed grid or length are folded into an initializer: no node makes them.
    if (
        (rotation.rank, rotation.sequence_axis) == (4, 1)
        and producer is not None
        and producer.op_type == "Reshape"
    ):
        rows = producer.input[0]
        # tf2onnx may add a leading axis first; it moves no value.
        source = next((n for n in emit.graph.node if rows in n.output), None)
        if source is not None and source.op_type == "Unsqueeze":
            rows = source.input[0]
        width = static_dim(info, rows, 1)
        if rank(info, rows) == 2 and width in (None, static_dim(info, rotation.x, 3)):
            return rows
    return emit.op("Flatten", [table], axis=-1)


def _decompose(proto: onnx.ModelProto, rotation: Rotation, info: dict) -> None:
    """Makes `swap(x)` a Split and a Concat along the channels (no whole-tensor transpose)."""
    emit = Emitter(proto, rotation.graph, rotation.add.name + "/swap_")
    x, axis, rank = rotation.x, rotation.feature_axis, rotation.rank
    if rotation.layout == "half":
        first, second = emit.split_halves(x, axis)
        swapped = emit.op("Concat", [second, first], axis=axis)
    elif axis == rank - 1:
        # (..., rotary_dim) -> (..., rotary_dim / 2, 2): the pairs' channels are the last axis.
        pairs = emit.op("Reshape", [x, emit.constant([0] * (rank - 1) + [-1, 2])])
        first, second = emit.split_halves(pairs, rank)
        swapped = emit.op("Concat", [second, first], axis=rank)
        swapped = emit.op("Reshape", [swapped, emit.constant([0] * (rank - 1) + [-1])])
    else:
        width = static_dim(info, x, axis)
        if width is None:
            return  # the graph's own swap stays
        permutation = np.arange(width).reshape(-1, 2)[:, ::-1].reshape(-1)
        swapped = emit.op("Gather", [x, emit.constant(permutation)], axis=axis)
    emit.insert_before(rotation.swap_mul)
    inputs = rotation.swap_mul.input
    index = 0 if inputs[0] != rotation.sin_table else 1
    inputs[index] = swapped
