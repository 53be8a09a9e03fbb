"""The rewrites of a converted ONNX graph, one pass per module, run in the order of `PASSES`.

Nothing here imports TensorFlow, Keras or a layer: the passes read ONNX graphs only (the
rotation scope they look for is `keras_posenc._scope`, which imports nothing).

- `graph`: tools every pass shares (subgraphs, producers, `Emitter`, tensor keys);
- `constants` (`dedupe_constants`): duplicated constants merged, on every conversion;
- `erfc` (`replace_erfc`): `Erfc` as `1 - Erf`;
- `rotary` (`rewrite_rotations`): each marked rotation as a kernel or lean standard ops;
- `reshape_sizes` (`literal_reshape_sizes`): computed reshapes take a 0 as TensorFlow does;
- `cse` (`merge_common_subexpressions`), on `shapes` (with `values` and `sizes`):
  what is computed twice, computed once;
- `guards` (`hoist_guards`): the NaN poisoning of bad positions off the fast path.

Each pass is a function `pass_(proto) -> int` that changes the proto in place and returns
how many rewrites it made. `optimized` runs `PASSES`, then `onnx.checker`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import onnx

from keras_posenc.export.onnx_passes.constants import dedupe_constants
from keras_posenc.export.onnx_passes.cse import merge_common_subexpressions
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
    "op_counts",
    "optimized",
    "remove_unused_nodes",
    "replace_erfc",
    "rewrite_rotations",
    "run_passes",
    "streamline",
    "to_opset",
]

ROTARY_OPTIONS = ("fused", "decomposed")


@dataclasses.dataclass(frozen=True)
class Target:
    """What the file is written for: the rotary option and the opset (None: the model's)."""

    rotary: str = "fused"
    opset: int | None = None


@dataclasses.dataclass(frozen=True)
class Pass:
    """One step of `PASSES`: `run(proto, target)` rewrites in place and returns how many."""

    name: str
    run: Callable[[onnx.ModelProto, Target], int]
    reason: str  # why it stands where it does


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


def _each(function: Callable[[onnx.ModelProto], int]) -> Callable[[onnx.ModelProto, Target], int]:
    return lambda proto, target: function(proto)


# In order, with the reason for each place (before them, on every conversion, rotary or
# not: `dedupe_constants`, which `onnx_export.onnx_model` runs).
PASSES: tuple[Pass, ...] = (
    Pass(
        "erfc",
        _each(replace_erfc),
        "First: ONNX has no Erfc, so neither the version converter (next) nor onnx.checker "
        "takes a graph that holds one.",
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
        "Last: the guards' new Ifs of one condition and equal branches (one per layer that "
        "looks up the same rows) become one.",
    ),
)
# The passes after the rotations' rewrite.
_STREAMLINE = PASSES[[p.name for p in PASSES].index("rotary") + 1 :]


def run_passes(proto: onnx.ModelProto, passes=PASSES, target: Target = Target()) -> dict:
    """Runs `passes` in order on `proto`, in place; returns each one's count by name."""
    return {step.name: step.run(proto, target) for step in passes}


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

    `Erfc` becomes `1 - Erf`; with `opset` of `STANDARD_ROTARY_OPSET` or later the model is
    converted to it and `rotary="fused"` emits the ONNX `RotaryEmbedding`, below it
    onnxruntime's `com.microsoft.RotaryEmbedding`; `rotary="decomposed"` keeps standard
    ops; then `streamline`. The result passes `onnx.checker.check_model(full_check=True)`.

    Args:
        proto: the converted model, changed in place.
        rotary: `"fused"` or `"decomposed"`.
        opset: the opset to write; None keeps the model's.

    Returns:
        `proto`, rewritten.
    """
    if rotary not in ROTARY_OPTIONS:
        raise ValueError(f"Unknown rotary={rotary!r}; expected 'fused' or 'decomposed'.")
    run_passes(proto, PASSES, Target(rotary, opset))
    onnx.checker.check_model(proto, full_check=True)
    return proto
