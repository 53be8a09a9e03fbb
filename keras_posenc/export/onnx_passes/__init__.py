"""The rewrites of a converted ONNX graph, one pass per module, run in the order of `PASSES`.

Nothing here imports TensorFlow, Keras or a layer: the passes read ONNX graphs only (the
rotation scope they look for is `keras_posenc._scope`, which imports nothing).

- `graph`: tools every pass shares (subgraphs, producers, `Emitter`, tensor keys);
- `erfc` (`replace_erfc`): `Erfc` as `1 - Erf`;
- `constants` (`dedupe_constants`): duplicated constants merged;
- `rotary` (`rewrite_rotations`): each marked rotation as a kernel or lean standard ops;
- `reshape_sizes` (`literal_reshape_sizes`): computed reshapes take a 0 as TensorFlow does;
- `cse` (`merge_common_subexpressions`), on `shapes` (with `values` and `sizes`):
  what is computed twice, computed once;
- `guards` (`hoist_guards`): the NaN poisoning of bad positions off the fast path;
- `dynamic_axes` (`name_dynamic_axes`): the inputs' and outputs' `batch` and `sequence`.

Each pass is a function `pass_(proto) -> int` that changes the proto in place and returns
how many rewrites it made. `PASSES` is the one pipeline, in order, with the caller's own
passes and its checks of the converted graph as steps of it; `run_pipeline` runs it for a
`Target`, then `onnx.checker` once (what `save_onnx` writes); `optimized` does so for a
rotary option and an opset.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import onnx

from keras_posenc.export.onnx_passes.constants import dedupe_constants
from keras_posenc.export.onnx_passes.cse import merge_common_subexpressions
from keras_posenc.export.onnx_passes.dynamic_axes import name_dynamic_axes
from keras_posenc.export.onnx_passes.erfc import replace_erfc
from keras_posenc.export.onnx_passes.graph import (
    default_opset,
    graphs,
    op_counts,
    remove_unused_nodes,
)
from keras_posenc.export.onnx_passes.guards import hoist_guards
from keras_posenc.export.onnx_passes.reshape_sizes import literal_reshape_sizes
from keras_posenc.export.onnx_passes.rotary import (
    FORMS,
    STANDARD_ROTARY_OPSET,
    Rotation,
    RotationMismatch,
    find_rotations,
    rewrite_rotations,
)

__all__ = [
    "FORMS",
    "PASSES",
    "ROTARY_OPTIONS",
    "STANDARD_ROTARY_OPSET",
    "Pass",
    "Rotation",
    "RotationMismatch",
    "Target",
    "dedupe_constants",
    "find_rotations",
    "graphs",
    "hoist_guards",
    "literal_reshape_sizes",
    "merge_common_subexpressions",
    "name_dynamic_axes",
    "op_counts",
    "optimized",
    "remove_unused_nodes",
    "replace_erfc",
    "rewrite_rotations",
    "run_passes",
    "run_pipeline",
    "streamline",
    "to_opset",
]

ROTARY_OPTIONS = ("fused", "decomposed")


@dataclasses.dataclass(frozen=True)
class Target:
    """What the file is written for, and what the exporter adds to the pipeline.

    Args:
        rotary: `"fused"` or `"decomposed"`; None: the graph as converted (the steps of
            `PASSES` marked `optimizes` are left out: no opset conversion, no rewrite).
        opset: the opset to write; None keeps the model's.
        extra: the caller's own passes, `pass_(proto)` changing the proto in place or
            returning a new one (`onnx_export.GRAPH_PASSES` by default).
        check: the exporter's checks of the converted graph, `check(proto)`, which raise
            (`onnx_export`: every op ONNX's, the inputs the signature's).
    """

    rotary: str | None = "fused"
    opset: int | None = None
    extra: tuple[Callable[[onnx.ModelProto], onnx.ModelProto | None], ...] = ()
    check: Callable[[onnx.ModelProto], None] | None = None


@dataclasses.dataclass(frozen=True)
class Pass:
    """One step of `PASSES`: `run(proto, target)` rewrites in place and returns how many.

    `optimizes`: a rewrite for the target's rotary option and opset, left out for a graph
    kept as converted (`Target.rotary` None); the others run on every conversion.
    """

    name: str
    run: Callable[[onnx.ModelProto, Target], int]
    reason: str  # why it stands where it does
    optimizes: bool = True


def to_opset(proto: onnx.ModelProto, opset: int) -> onnx.ModelProto:
    """`proto` converted to `opset` by `onnx.version_converter` (for `form="standard"`)."""
    from onnx import version_converter

    return version_converter.convert_version(proto, opset)


def _convert_opset(proto: onnx.ModelProto, target: Target) -> int:
    if target.opset is None or target.opset == default_opset(proto):
        return 0
    proto.CopyFrom(to_opset(proto, target.opset))
    return 1


def _rotary(proto: onnx.ModelProto, target: Target) -> int:
    form = target.rotary
    if form == "fused" and default_opset(proto) >= STANDARD_ROTARY_OPSET:
        form = "standard"  # the ONNX kernel; onnxruntime's is for the opsets below
    return rewrite_rotations(proto, form)


def _extra(proto: onnx.ModelProto, target: Target) -> int:
    for rewrite in target.extra:
        rewritten = rewrite(proto)
        if rewritten is not None and rewritten is not proto:
            proto.CopyFrom(rewritten)
    return len(target.extra)


def _check(proto: onnx.ModelProto, target: Target) -> int:
    if target.check is not None:
        target.check(proto)
    return 0


def _each(function: Callable[[onnx.ModelProto], int]) -> Callable[[onnx.ModelProto, Target], int]:
    return lambda proto, target: function(proto)


# In order, with the reason for each place.
PASSES: tuple[Pass, ...] = (
    Pass(
        "erfc",
        _each(replace_erfc),
        "First: ONNX has no Erfc, so neither the check of the converted graph's ops, the "
        "version converter nor onnx.checker takes a graph that holds one.",
        optimizes=False,
    ),
    Pass(
        "extra",
        _extra,
        "The caller's own passes, on the graph as converted (Erfc gone) and before the "
        "check, which what they make must pass: a pass may replace an op ONNX lacks.",
        optimizes=False,
    ),
    Pass(
        "check",
        _check,
        "Before any rewrite of ours: a graph with an op ONNX lacks or an input the "
        "signature lacks is refused with an error that names them, not a pass's failure.",
        optimizes=False,
    ),
    Pass(
        "constants",
        _each(dedupe_constants),
        "On every conversion, before the opset conversion and the rotations: every traced "
        "use of a position table is its own constant, and the rewrites read the merged ones.",
        optimizes=False,
    ),
    Pass(
        "opset",
        _convert_opset,
        "Before the rotations: the kernel they become depends on the opset (the ONNX "
        "RotaryEmbedding from 23, onnxruntime's below), and the converter knows only ONNX "
        "ops, not the com.microsoft kernel.",
    ),
    Pass(
        "rotary",
        _rotary,
        "On the graph as tf2onnx wrote it (each scope's products and sum), and before the "
        "passes below: the Reshape back to the input's shape a kernel writes is one that "
        "reshape_sizes makes literal, and the caches each kernel slices from the rows are "
        "what cse merges.",
    ),
    Pass(
        "reshape_sizes",
        _each(literal_reshape_sizes),
        "Before cse: a Reshape with allowzero=1 has sizes SymbolicShapes can follow, which "
        "is what proves two Shape nodes equal.",
    ),
    Pass(
        "cse",
        _each(merge_common_subexpressions),
        "Before guards: a guard's condition and its fast branch must name the same tensors "
        "for the clamps the condition implies to be dropped.",
    ),
    Pass(
        "guards",
        _each(hoist_guards),
        "After cse (see there); it copies the branch it makes fast, so cse runs again.",
    ),
    Pass(
        "cse_after_guards",
        _each(merge_common_subexpressions),
        "The last rewrite: the guards' new Ifs of one condition and equal branches (one per "
        "layer that looks up the same rows) become one.",
    ),
    Pass(
        "dynamic_axes",
        _each(name_dynamic_axes),
        "Last, on every conversion: the names of the inputs' and outputs' axes, on the "
        "graph in its final opset.",
        optimizes=False,
    ),
)
# The rewrites after the rotations' rewrite.
_STREAMLINE = tuple(
    p for p in PASSES[[p.name for p in PASSES].index("rotary") + 1 :] if p.optimizes
)


def run_passes(proto: onnx.ModelProto, passes=PASSES, target: Target = Target()) -> dict:
    """Runs `passes` in order on `proto`, in place; returns each one's count by name (0 for
    a step left out: one that `optimizes`, for `target.rotary` None)."""
    return {
        step.name: 0 if step.optimizes and target.rotary is None else step.run(proto, target)
        for step in passes
    }


def run_pipeline(proto: onnx.ModelProto, target: Target = Target()) -> onnx.ModelProto:
    """`PASSES` for `target` on tf2onnx's `proto`, then `onnx.checker` once.

    Args:
        proto: the converted model, changed in place.
        target: the rotary option and opset, and the exporter's own passes and checks.

    Returns:
        `proto`, rewritten; it passes `onnx.checker.check_model(full_check=True)`.
    """
    if target.rotary is not None and target.rotary not in ROTARY_OPTIONS:
        raise ValueError(f"Unknown rotary={target.rotary!r}; expected 'fused' or 'decomposed'.")
    run_passes(proto, PASSES, target)
    onnx.checker.check_model(proto, full_check=True)
    return proto


def streamline(proto: onnx.ModelProto) -> None:
    """The passes that follow the rotations' rewrite, in place (see `PASSES`).

    Reshapes to computed shapes take their sizes as TensorFlow does (`literal_reshape_sizes`:
    an empty axis stays empty, and the sizes can be followed), a runtime choice of rows
    loses its `Where` on the fast path, and what is computed twice (the same rows for the
    queries and the keys, and for every block that sees the input's length) is computed once.
    """
    run_passes(proto, _STREAMLINE)


def optimized(
    proto: onnx.ModelProto, rotary: str = "fused", opset: int | None = None
) -> onnx.ModelProto:
    """`PASSES` on tf2onnx's `proto`: what `save_onnx(rotary=..., opset=...)` writes.

    `Erfc` becomes `1 - Erf` and duplicated constants one; with `opset` of
    `STANDARD_ROTARY_OPSET` or later the model is converted to it and `rotary="fused"` emits
    the ONNX `RotaryEmbedding`, below it onnxruntime's `com.microsoft.RotaryEmbedding`;
    `rotary="decomposed"` keeps standard ops; then `streamline`, and the inputs' and
    outputs' axes are named. The result passes `onnx.checker.check_model(full_check=True)`
    (`run_pipeline`).

    Args:
        proto: the converted model, changed in place.
        rotary: `"fused"` or `"decomposed"`.
        opset: the opset to write; None keeps the model's.

    Returns:
        `proto`, rewritten.
    """
    if rotary not in ROTARY_OPTIONS:  # None too: `run_pipeline` takes it, this does not
        raise ValueError(f"Unknown rotary={rotary!r}; expected 'fused' or 'decomposed'.")
    return run_pipeline(proto, Target(rotary, opset))
