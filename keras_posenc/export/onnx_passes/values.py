"""The values of the small integer tensors that compute shapes (`Shape(x)`, a `Gather` of
it, a `Concat` of such, their `ReduceProd`, ...), each element a size (`sizes`).
"""

from __future__ import annotations

from typing import Protocol

import numpy as np
import onnx
from onnx import helper

from keras_posenc.export.onnx_passes.sizes import (
    INT32_LIMIT,
    Size,
    Value,
    product,
    slice_indices,
)

__all__ = ["ShapeSource", "ShapeValues"]


class ShapeSource(Protocol):
    """What `ShapeValues` reads of the graph and of its axes: `shapes.SymbolicShapes`, which
    owns these values (named here so that `values` does not import `shapes`, which imports it)."""

    def producer(self, tensor: str) -> tuple[onnx.NodeProto, int] | None: ...

    def constant(self, tensor: str) -> np.ndarray | None: ...

    def dims(self, tensor: str) -> tuple[Size, ...] | None: ...

    def reshape_dims(self, inputs, attributes) -> tuple[Size, ...] | None: ...

    def squeeze_dims(self, op: str, inputs, attributes) -> tuple[Size, ...] | None: ...


_SMALL = 64  # integer constants up to this many elements are followed as values


class ShapeValues:
    """The values of the small integer tensors of one graph, for its `SymbolicShapes`.

    The two recurse into each other: a `Reshape`'s axes follow from the value of its
    target, and the value of a reshaped shape from the axes rule of `Reshape`, which
    `shapes` gives (`reshape_dims`, `squeeze_dims`, with `dims`, `producer`, `constant`).
    """

    def __init__(self, shapes: ShapeSource):
        self.shapes = shapes
        self._values: dict[str, Value | None] = {}

    def value(self, tensor: str) -> Value | None:
        """`(shape, elements)` of a small integer tensor whose elements are sizes, or None."""
        if tensor not in self._values:
            self._values[tensor] = None
            self._values[tensor] = self._find_value(tensor)
        return self._values[tensor]

    def _find_value(self, tensor: str) -> Value | None:
        array = self.shapes.constant(tensor)
        if array is not None:
            if array.dtype.kind not in "iu" or array.size > _SMALL:
                return None
            return tuple(array.shape), tuple((int(v), ()) for v in array.reshape(-1))
        made = self.shapes.producer(tensor)
        if made is None:
            return None
        node, index = made
        if node.domain not in ("", "ai.onnx") or index:
            return None
        op, inputs = node.op_type, list(node.input)
        attributes = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        if op == "Shape":
            x = self.shapes.dims(inputs[0])
            if x is None:
                return None
            start, end = attributes.get("start", 0), attributes.get("end", len(x))
            picked = x[slice(start, end)]
            return (len(picked),), tuple(picked)
        if op == "Identity":
            return self.value(inputs[0])
        if op == "Cast":
            return self._cast_value(self.value(inputs[0]), attributes["to"])
        if op in ("Squeeze", "Unsqueeze", "Reshape"):
            given = self.value(inputs[0])
            if given is None:
                return None
            # The output's shape from the input's (not `dims` of the output, which asks
            # for this value first).
            shape = (
                self.shapes.reshape_dims(inputs, attributes)
                if op == "Reshape"
                else self.shapes.squeeze_dims(op, inputs, attributes)
            )
            if shape is None or any(s[1] for s in shape):
                return None
            return tuple(s[0] for s in shape), given[1]
        if op == "Gather":
            return self._gather_value(inputs, attributes)
        if op == "Slice":
            return self._slice_value(inputs)
        if op == "Concat":
            parts = [self.value(i) for i in inputs]
            if any(p is None or len(p[0]) != 1 for p in parts):
                return None
            elements = tuple(e for p in parts for e in p[1])
            return (len(elements),), elements
        if op == "ReduceProd":
            given = self.value(inputs[0])
            axes = attributes.get("axes")
            if given is None or len(given[0]) != 1 or (len(inputs) > 1 and inputs[1]):
                return None
            if axes not in (None, [0], [-1]):
                return None
            keep = attributes.get("keepdims", 1)
            return ((1,) if keep else ()), (product(given[1]),)
        if op in ("Max", "Min", "Mul", "Add", "Sub"):
            return self._arithmetic(op, [self.value(i) for i in inputs])
        return None

    def _gather_value(self, inputs, attributes):
        data, indices = self.value(inputs[0]), self.shapes.constant(inputs[1])
        if data is None or indices is None or len(data[0]) != 1 or attributes.get("axis", 0):
            return None
        count = data[0][0]
        picked = [int(i) % count if -count <= int(i) < count else None for i in indices.ravel()]
        if None in picked:
            return None
        return tuple(indices.shape), tuple(data[1][i] for i in picked)

    @staticmethod
    def _cast_value(given: Value | None, to: int) -> Value | None:
        """A size survives a cast to int64, and to int32 while it is one axis or below 2^31
        (a product of axes may not fit); narrower types wrap."""
        if given is None or to not in (onnx.TensorProto.INT64, onnx.TensorProto.INT32):
            return None
        if to == onnx.TensorProto.INT32 and any(
            len(symbols) > 1 or not -INT32_LIMIT <= c < INT32_LIMIT for c, symbols in given[1]
        ):
            return None
        return given

    def _slice_value(self, inputs):
        data = self.value(inputs[0])
        names = (inputs[1:] + [""] * 4)[:4]
        bounds = [self.shapes.constant(i) if i else None for i in names]
        if any(name and bound is None for name, bound in zip(names, bounds, strict=True)):
            return None  # a bound known only at run time
        if data is None or len(data[0]) != 1 or bounds[0] is None or bounds[1] is None:
            return None
        if bounds[2] is not None and [int(a) for a in bounds[2].ravel()] not in ([0], [-1]):
            return None
        step = 1 if bounds[3] is None else int(bounds[3].ravel()[0])
        start, end = int(bounds[0].ravel()[0]), int(bounds[1].ravel()[0])
        picked = slice_indices(start, end, step, len(data[1]))
        if picked is None:
            return None
        elements = tuple(data[1][i] for i in picked)
        return (len(elements),), elements

    def _arithmetic(self, op: str, values):
        if any(v is None for v in values) or len(values) != 2:
            return None
        (shape_a, a), (shape_b, b) = values
        if shape_a != shape_b:
            return None
        out = []
        for x, y in zip(a, b, strict=True):
            if op in ("Max", "Min") and x == y:
                out.append(x)
            elif op == "Mul":
                out.append(product([x, y]))
            elif not x[1] and not y[1]:
                numbers = {"Max": max, "Min": min, "Add": int.__add__, "Sub": int.__sub__}
                out.append((numbers[op](x[0], y[0]), ()))
            else:
                return None
        return shape_a, tuple(out)
