"""Rewrites of a converted ONNX graph: fused RoPE, a lean decomposed RoPE, `Erfc`.

tf2onnx turns a rotation's channel swap into whole-tensor data movement (a Transpose,
ReverseSequence and Transpose for the reshape-and-reverse form). The passes here find each
rotation by the name scope `RotaryEmbedding` puts on its ops (`keras_posenc._scope`,
defined once for the layer and this pass), which survives into the ONNX node names, and rewrite it:

- `"fused"`: one `com.microsoft.RotaryEmbedding` node (onnxruntime's kernel, opset <= 22);
- `"standard"`: the ONNX `RotaryEmbedding` of opset 23 (convert the model first, `to_opset`);
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

from keras_posenc._scope import read_rotation_scope
from keras_posenc.export.onnx_cse import merge_common_subexpressions
from keras_posenc.export.onnx_graph import (
    Emitter,
    default_opset,
    elem_type,
    graphs,
    op_counts,
    rank,
    remove_unused_nodes,
    static_dim,
    tensor_info,
)
from keras_posenc.export.onnx_guards import hoist_guards
from keras_posenc.export.onnx_shapes import literal_reshape_sizes

__all__ = [
    "FORMS",
    "Rotation",
    "find_rotations",
    "graphs",
    "hoist_guards",
    "merge_common_subexpressions",
    "op_counts",
    "optimized",
    "remove_unused_nodes",
    "replace_erfc",
    "rewrite_rotations",
    "streamline",
    "to_opset",
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


def _producers(graph: onnx.GraphProto) -> dict[str, onnx.NodeProto]:
    return {name: node for node in graph.node for name in node.output}


def _moved_from(name: str, producers: dict, depth: int = 12) -> set[str]:
    """Every tensor `name` is made from through data-movement ops only (itself included)."""
    found, frontier = {name}, [name]
    for _ in range(depth):
        following = []
        for tensor in frontier:
            node = producers.get(tensor)
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
        producers = _producers(graph)
        for node in graph.node:
            scope = read_rotation_scope(node.name)
            if node.op_type != "Add" or scope is None:
                continue
            muls = [producers.get(name) for name in node.input]
            if any(m is None or m.op_type != "Mul" for m in muls):
                continue
            found = _split_rotation(muls, producers)
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
                )
            )
    return rotations


def _split_rotation(muls, producers):
    """`(x, swap_mul, C, S)` of `x·C + swap(x)·S`, or None if the Muls are not that."""
    for cos_mul, swap_mul in (muls, muls[::-1]):
        for i in (0, 1):
            for j in (0, 1):
                x, swapped = cos_mul.input[i], swap_mul.input[j]
                if swapped != x and x in _moved_from(swapped, producers):
                    return x, swap_mul, cos_mul.input[1 - i], swap_mul.input[1 - j]
    return None


_KERNEL_TYPES = {onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16}


def rewrite_rotations(proto: onnx.ModelProto, form: str = "fused") -> int:
    """Rewrites every marked rotation of `proto` in place as `form`; returns how many.

    `form` is one of `FORMS`. A rotation the kernel cannot take (channels not the last
    axis, heads before the sequence axis in any arrangement but (batch, heads, sequence,
    channels), or a float64 input) gets the decomposed form instead. `"standard"` needs a
    model of opset `STANDARD_ROTARY_OPSET` or later (`to_opset`).
    """
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
    rotations = find_rotations(proto)
    if not rotations:
        return 0
    info = tensor_info(proto)
    uses_kernel = False
    for rotation in rotations:
        kernel_fits = (
            rotation.feature_axis == rotation.rank - 1
            and (rotation.rank, rotation.sequence_axis) in ((3, 1), (4, 1), (4, 2))
            and elem_type(info, rotation.x) in _KERNEL_TYPES
        )
        if form != "decomposed" and kernel_fits:
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
    if interleaved:
        # C repeats cos over each pair (c, c); S holds (-s, s).
        cos = emit.op("Slice", [rows[0], *map(emit.constant, ([0], [2**62], [1], [2]))])
        sin = emit.op("Slice", [rows[1], *map(emit.constant, ([1], [2**62], [1], [2]))])
    else:
        # C is (cos, cos) along the channels, S is (-sin, sin).
        width = static_dim(info, x, rotation.feature_axis)
        if width is None:
            cos = emit.split_halves(rows[0], 1)[0]
            sin = emit.split_halves(rows[1], 1)[1]
        else:  # a slice makes only the half it keeps
            half = width // 2
            cos = emit.op("Slice", [rows[0], *map(emit.constant, ([0], [half], [1]))])
            sin = emit.op("Slice", [rows[1], *map(emit.constant, ([half], [width], [1]))])
    shape = emit.op("Shape", [x])
    if rotation.rank == 4 and rotation.sequence_axis == 1:
        # (batch, sequence, heads, channels) -> (batch, sequence, heads·channels): no copy.
        kernel_input = emit.op("Reshape", [x, emit.constant([0, 0, -1])])
    else:
        kernel_input = x
    attributes = {"interleaved": int(interleaved)}
    if standard:
        # Rows given per (batch, position), no position ids: (batch, sequence, rotary_dim / 2).
        sequence = emit.op(
            "Slice",
            [
                shape,
                emit.constant([rotation.sequence_axis]),
                emit.constant([rotation.sequence_axis + 1]),
            ],
        )
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
        if rotation.per_batch:
            # Row b·sequence + i serves position i of batch row b.
            sequence = emit.op(
                "Slice",
                [
                    shape,
                    emit.constant([rotation.sequence_axis]),
                    emit.constant([rotation.sequence_axis + 1]),
                ],
            )
            count = emit.op(
                "Squeeze",
                [emit.op("Slice", [emit.op("Shape", [rows[0]]), *map(emit.constant, ([0], [1]))])],
            )
            ids = emit.op("Range", [emit.constant(0), count, emit.constant(1)])
            ids_shape = emit.op("Concat", [emit.constant([-1]), sequence], axis=0)
            ids = emit.op("Reshape", [ids, ids_shape])
        else:
            # One id: the offset of the first position into the rows, which are this call's.
            ids = emit.constant([0])
        rotated = emit.op(
            "RotaryEmbedding", [kernel_input, ids, cos, sin], domain=MICROSOFT_DOMAIN, **attributes
        )
    if kernel_input is not x:
        emit.op("Reshape", [rotated, shape], [output])
    else:
        emit.nodes[-1].output[0] = output
    emit.insert_before(rotation.add)
    rotation.graph.node.remove(rotation.add)


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


def to_opset(proto: onnx.ModelProto, opset: int) -> onnx.ModelProto:
    """`proto` converted to `opset` by `onnx.version_converter` (for `form="standard"`)."""
    from onnx import version_converter

    return version_converter.convert_version(proto, opset)


def replace_erfc(proto: onnx.ModelProto) -> int:
    """Rewrites every `Erfc(x)` (which ONNX lacks) as `1 - Erf(x)`, in place; returns how many.

    tf2onnx leaves `Erfc` from the exact `gelu` (`0.5·x·erfc(-x/√2)`). The difference
    `1 - erf` loses erfc's relative precision where it is tiny, but not its absolute one
    (float32 rounding of a value in [0, 2]), which is what the output carries.
    """
    info = None
    count = 0
    for graph in graphs(proto.graph):
        for node in list(graph.node):
            if node.op_type != "Erfc" or node.domain not in ("", "ai.onnx"):
                continue
            if info is None:
                info = tensor_info(proto)
            dtype = elem_type(info, node.input[0]) or onnx.TensorProto.FLOAT
            emit = Emitter(proto, graph, node.name + "/erfc_")
            one = emit.constant(1.0, helper.tensor_dtype_to_np_dtype(dtype))
            emit.op("Sub", [one, emit.op("Erf", [node.input[0]])], list(node.output))
            emit.insert_before(node)
            graph.node.remove(node)
            count += 1
    return count


def streamline(proto: onnx.ModelProto) -> None:
    """The passes that follow the rotations' rewrite, in place (see `onnx_guards`, `onnx_cse`).

    Reshapes to computed shapes take their sizes as TensorFlow does (`literal_reshape_sizes`:
    an empty axis stays empty, and the sizes can be followed), a runtime choice of rows
    loses its `Where` on the fast path, and what is computed twice (the same rows for the
    queries and the keys, and for every block that sees the input's length) is computed once.
    """
    literal_reshape_sizes(proto)
    # Merged first, so that a guard's conditions and its fast branch name the same tensors.
    merge_common_subexpressions(proto)
    hoist_guards(proto)
    merge_common_subexpressions(proto)


def optimized(
    proto: onnx.ModelProto, rotary: str = "fused", opset: int | None = None
) -> onnx.ModelProto:
    """Every pass here on tf2onnx's `proto`: what `save_onnx(rotary=..., opset=...)` writes.

    `Erfc` becomes `1 - Erf`; with `opset` of `STANDARD_ROTARY_OPSET` or later the model is
    converted to it and `rotary="fused"` emits the ONNX `RotaryEmbedding`, below it
    onnxruntime's `com.microsoft.RotaryEmbedding`; `rotary="decomposed"` keeps standard
    ops; then `streamline`. The result passes `onnx.checker.check_model(full_check=True)`.

    Args:
        proto: the converted model (changed in place unless it is converted to `opset`).
        rotary: `"fused"` or `"decomposed"`.
        opset: the opset to write; None keeps the model's.

    Returns:
        The rewritten model.
    """
    if rotary not in ("fused", "decomposed"):
        raise ValueError(f"Unknown rotary={rotary!r}; expected 'fused' or 'decomposed'.")
    replace_erfc(proto)
    if opset is not None and opset != default_opset(proto):
        proto = to_opset(proto, opset)
    form = rotary
    if rotary == "fused" and default_opset(proto) >= STANDARD_ROTARY_OPSET:
        form = "standard"
    rewrite_rotations(proto, form)
    streamline(proto)
    onnx.checker.check_model(proto, full_check=True)
    return proto
