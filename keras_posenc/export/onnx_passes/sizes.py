"""Sizes as monomials: the arithmetic of `shapes` and `values`, which knows no op.

A size is `c * a * b ...` (a coefficient and the sorted symbols it multiplies), and a
small integer tensor (`Shape(x)`, a `Gather` of it, a `Concat` of such, their
`ReduceProd`) is its shape and its elements, each a size.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper

__all__ = [
    "INT32_LIMIT",
    "ONE",
    "Size",
    "Value",
    "constant_value",
    "product",
    "quotient",
    "slice_indices",
    "zero_only_with",
]

Size = tuple[int, tuple]
Value = tuple[tuple[int, ...], tuple[Size, ...]]  # a small integer tensor: shape, elements

ONE: Size = (1, ())
INT32_LIMIT = 2**31


def constant_value(
    tensor: str,
    initializers: dict[str, onnx.TensorProto],
    producers: dict[str, tuple[onnx.NodeProto, int]],
) -> np.ndarray | None:
    """The value of an initializer or of a `Constant` node's `value`, else None."""
    if tensor in initializers:
        return numpy_helper.to_array(initializers[tensor])
    node = producers.get(tensor, (None,))[0]
    if node is not None and node.op_type == "Constant" and not node.domain:
        for attribute in node.attribute:
            if attribute.name == "value":
                return numpy_helper.to_array(attribute.t)
    return None


def slice_indices(start: int, end: int, step: int, size: int) -> range | None:
    """The indices ONNX's `Slice` takes from an axis of `size` (its clamping, not Python's)."""
    if step == 0:
        return None
    start += size if start < 0 else 0
    end += size if end < 0 else 0
    if step > 0:
        start, end = min(max(start, 0), size), min(max(end, 0), size)
    else:
        start, end = min(max(start, 0), size - 1), min(max(end, -1), size - 1)
    return range(start, end, step)


def product(sizes) -> Size:
    coefficient, symbols = 1, ()
    for c, s in sizes:
        coefficient *= c
        symbols += s
    return coefficient, tuple(sorted(symbols))


def quotient(numerator: Size, denominator: Size) -> Size | None:
    """`numerator / denominator` as a monomial, or None when it is not one."""
    (c, symbols), (d, divisors) = numerator, denominator
    if d == 0 or c % d:
        return None
    left = list(symbols)
    for symbol in divisors:
        if symbol not in left:
            return None
        left.remove(symbol)
    return c // d, tuple(left)


def zero_only_with(size: Size, axis: Size) -> bool:
    """Whether `size` (a product of sizes, not 0) is 0 only where `axis` is: every symbol
    of `size` is a factor of `axis`."""
    return bool(size[0]) and set(size[1]) <= set(axis[1])
