"""The name scope a rotation's ops carry, for the ONNX passes to find (defined once here).

`RotaryEmbedding` puts each rotation's ops under `rotation_scope(...)`; tf2onnx keeps the
scope in the ONNX node names, and `keras_posenc.export.onnx_passes.rotary` reads it back
with `read_rotation_scope`. Both come from the one template below, so they cannot drift
apart. This module imports nothing: the layers and the TensorFlow-free passes share it.
"""

from __future__ import annotations

import dataclasses
import re
import string

__all__ = ["ROTATION_SCOPE", "RotationScope", "read_rotation_scope", "rotation_scope"]

ROTATION_SCOPE = "posenc_rotation_{layout}_r{rank}_s{sequence_axis}_f{feature_axis}_b{per_batch}"
# What each field of the template may hold; the others are non-negative integers.
_FIELDS = {"layout": "half|interleaved", "per_batch": "[01]"}
_INTEGER = r"\d+"


@dataclasses.dataclass(frozen=True)
class RotationScope:
    """What the scope of one rotation says about it."""

    layout: str
    rank: int
    sequence_axis: int
    feature_axis: int
    per_batch: bool  # rows per batch row (positions of shape (batch, sequence))
    prefix: str  # the node name up to the scope's end: one per traced rotation


def rotation_scope(
    layout: str, rank: int, sequence_axis: int, feature_axis: int, per_batch: bool
) -> str:
    """The name scope of a rotation of these properties."""
    return ROTATION_SCOPE.format(
        layout=layout,
        rank=rank,
        sequence_axis=sequence_axis,
        feature_axis=feature_axis,
        per_batch=int(per_batch),
    )


def _pattern(template: str) -> re.Pattern:
    parts = []
    for literal, field, _, _ in string.Formatter().parse(template):
        parts.append(re.escape(literal))
        if field is not None:
            parts.append(f"(?P<{field}>{_FIELDS.get(field, _INTEGER)})")
    # TensorFlow makes a scope entered again unique with a suffix `_1`, `_2`, ...
    return re.compile("".join(parts) + r"(?:_\d+)?/")


_SCOPE = _pattern(ROTATION_SCOPE)


def read_rotation_scope(node_name: str) -> RotationScope | None:
    """The rotation scope in `node_name`, or None if it is in none."""
    match = _SCOPE.search(node_name)
    if match is None:
        return None
    return RotationScope(
        match["layout"],
        int(match["rank"]),
        int(match["sequence_axis"]),
        int(match["feature_axis"]),
        match["per_batch"] == "1",
        node_name[: match.end()],
    )
