"""The dynamic axes pass: axis 0 of the graph's inputs and outputs named `batch`, axis 1
`sequence`, where tf2onnx left their sizes unknown (and unnamed).

A runtime (and a reader) then sees which axes of the inputs and outputs are the same size.
"""

from __future__ import annotations

import onnx

__all__ = ["DYNAMIC_AXES", "name_dynamic_axes"]

DYNAMIC_AXES = ("batch", "sequence")


def name_dynamic_axes(proto: onnx.ModelProto) -> int:
    """Names the unknown axes 0 and 1 of the inputs and outputs (`DYNAMIC_AXES`), in place.

    Returns:
        How many axes were named.
    """
    named = 0
    for value in [*proto.graph.input, *proto.graph.output]:
        dims = value.type.tensor_type.shape.dim
        for axis, name in enumerate(DYNAMIC_AXES[: len(dims)]):
            if not dims[axis].HasField("dim_value") and dims[axis].dim_param != name:
                dims[axis].dim_param = name
                named += 1
    return named
