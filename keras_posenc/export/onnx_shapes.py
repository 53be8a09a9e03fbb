"""Symbolic shapes of an ONNX graph: which axes of two tensors are provably the same size.

tf2onnx writes every length as `Shape(x)` of the tensor at hand, so each block of a model
reads the sequence length from its own tensors, and nothing in the file says that they are
all the graph input's. Here each axis of a tensor gets a size made of symbols: a monomial
`c * a * b ...` of the graph inputs' axes (and of fresh symbols for sizes nothing here can
follow, an `If`'s outputs for instance), and so does each element of a small integer tensor
(a shape being computed: `Shape`, `Gather`, `Concat`, `ReduceProd`, ...). Two tensors whose
axes have equal monomials have equal shapes at any input on which the graph runs: the rules
below are those of the ops' definitions, and broadcasting merges two sizes only when one is
1 or both are the same monomial. `onnx_cse` merges `Shape(a)` and `Shape(b)` on that proof.
"""

from __future__ import annotations

import itertools
import string
from collections.abc import Callable

import numpy as np
import onnx
from onnx import helper, numpy_helper

__all__ = ["SymbolicShapes", "constant_value"]

# A size: (coefficient, sorted symbols), the product coefficient * symbol * symbol ...
Size = tuple[int, tuple]
Value = tuple[tuple[int, ...], tuple[Size, ...]]  # a small integer tensor: shape, elements

_ONE: Size = (1, ())
_SAME_SHAPE = {
    *"Abs Neg Sqrt Reciprocal Exp Log Erf Tanh Sigmoid Relu Cast Identity Not Sin Cos".split(),
    *"Floor Ceil Round Sign Softmax LogSoftmax Gelu Elu LeakyRelu HardSigmoid IsNaN".split(),
    *"IsInf Softplus Softsign HardSwish Mish Selu Celu ThresholdedRelu Clip".split(),
    "LayerNormalization",
    "RMSNormalization",
    "RotaryEmbedding",
}
_BROADCAST = {
    *"Add Sub Mul Div Pow Max Min Mod Equal Less Greater LessOrEqual GreaterOrEqual".split(),
    *"And Or Xor Where PRelu BitShift Sum Mean".split(),
}
# Ops of onnxruntime's domain whose first output has the shape of their first input.
_MICROSOFT_SAME_SHAPE = {"RotaryEmbedding", "FastGelu", "BiasGelu", "Gelu", "QuickGelu"}
_INT_TYPES = {
    onnx.TensorProto.INT64,
    onnx.TensorProto.INT32,
    onnx.TensorProto.INT16,
    onnx.TensorProto.INT8,
    onnx.TensorProto.UINT64,
    onnx.TensorProto.UINT32,
    onnx.TensorProto.UINT16,
    onnx.TensorProto.UINT8,
}
_SMALL = 64  # integer constants up to this many elements are followed as values


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


def _product(sizes) -> Size:
    coefficient, symbols = 1, ()
    for c, s in sizes:
        coefficient *= c
        symbols += s
    return coefficient, tuple(sorted(symbols))


def _quotient(numerator: Size, denominator: Size) -> Size | None:
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


class SymbolicShapes:
    """Sizes of the axes (`dims`) and of small integer values (`value`) of a graph's tensors.

    Args:
        producer: the node and output index that make a tensor, or None (an input, an
            initializer or a tensor of an outer graph).
        constant: the value of an initializer or a `Constant` output, or None.
        input_type: the declared type of a graph input, or None.
    """

    def __init__(
        self,
        producer: Callable[[str], tuple[onnx.NodeProto, int] | None],
        constant: Callable[[str], np.ndarray | None],
        input_type: Callable[[str], onnx.TypeProto | None],
    ):
        self.producer = producer
        self.constant = constant
        self.input_type = input_type
        self._dims: dict[str, tuple[Size, ...] | None] = {}
        self._values: dict[str, Value | None] = {}
        self._fresh = itertools.count()

    @classmethod
    def of_graph(cls, graph: onnx.GraphProto) -> SymbolicShapes:
        """The sizes of the tensors of `graph` (a main graph: it reads no outer tensor)."""
        producers = {o: (n, i) for n in graph.node for i, o in enumerate(n.output) if o}
        initializers = {t.name: t for t in graph.initializer}
        inputs = {i.name: i.type for i in graph.input}

        def constant(tensor: str) -> np.ndarray | None:
            return constant_value(tensor, initializers, producers)

        return cls(producers.get, constant, inputs.get)

    def fresh(self) -> Size:
        return 1, (("fresh", next(self._fresh)),)

    def proven_dims(self, tensor: str) -> tuple[Size, ...] | None:
        """`dims(tensor)` where every axis is a size of the graph's inputs, else None."""
        dims = self.dims(tensor)
        if dims is None or any(symbol[0] == "fresh" for _, symbols in dims for symbol in symbols):
            return None
        return dims

    # -- axes ------------------------------------------------------------------------

    def dims(self, tensor: str) -> tuple[Size, ...] | None:
        """The size of each axis of `tensor`, or None where its rank is not known."""
        if tensor not in self._dims:
            self._dims[tensor] = None  # a cycle cannot happen, but must not recurse
            self._dims[tensor] = self._find_dims(tensor)
        return self._dims[tensor]

    def _find_dims(self, tensor: str) -> tuple[Size, ...] | None:
        array = self.constant(tensor)
        if array is not None:
            return tuple((int(d), ()) for d in array.shape)
        made = self.producer(tensor)
        if made is None:
            kind = self.input_type(tensor)
            if kind is None or not kind.tensor_type.HasField("shape"):
                return None
            return tuple(
                (int(d.dim_value), ()) if d.HasField("dim_value") else (1, (("input", tensor, i),))
                for i, d in enumerate(kind.tensor_type.shape.dim)
            )
        node, index = made
        found = self._node_dims(node, index)
        return None if found is None else tuple(found)

    def _node_dims(self, node: onnx.NodeProto, index: int):
        op, inputs = node.op_type, list(node.input)
        attributes = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        if node.domain == "com.microsoft":
            return self.dims(inputs[0]) if op in _MICROSOFT_SAME_SHAPE and index == 0 else None
        if node.domain not in ("", "ai.onnx"):
            return None
        if op in _SAME_SHAPE:
            return self.dims(inputs[0]) if index == 0 else None
        if op in _BROADCAST:
            return self._broadcast([self.dims(i) for i in inputs if i])
        value = self.value(node.output[index])
        if value is not None:  # a shape being computed: its own shape is known too
            return tuple((size, ()) for size in value[0])
        if op in ("Shape", "Constant"):
            return None
        if op == "MatMul":
            a, b = self.dims(inputs[0]), self.dims(inputs[1])
            if a is None or b is None or len(a) < 2 or len(b) < 2:
                return None
            batch = self._broadcast([a[:-2], b[:-2]])
            return None if batch is None else (*batch, a[-2], b[-1])
        if op == "Gemm":
            a, b = self.dims(inputs[0]), self.dims(inputs[1])
            if a is None or b is None or len(a) != 2 or len(b) != 2:
                return None
            rows = a[1] if attributes.get("transA", 0) else a[0]
            return rows, (b[0] if attributes.get("transB", 0) else b[1])
        if op == "Transpose":
            x = self.dims(inputs[0])
            if x is None:
                return None
            perm = attributes.get("perm", list(range(len(x)))[::-1])
            return tuple(x[p] for p in perm)
        if op == "Reshape":
            return self._reshape(inputs, attributes)
        if op in ("Squeeze", "Unsqueeze"):
            return self._squeeze(op, inputs, attributes)
        if op == "Slice":
            return self._slice(inputs)
        if op == "Concat":
            return self._concat([self.dims(i) for i in inputs], attributes["axis"])
        if op == "Gather":
            data, indices = self.dims(inputs[0]), self.dims(inputs[1])
            if data is None or indices is None:
                return None
            axis = attributes.get("axis", 0) % len(data)
            return (*data[:axis], *indices, *data[axis + 1 :])
        if op in ("GlobalAveragePool", "GlobalMaxPool"):
            x = self.dims(inputs[0])
            return None if x is None else (*x[:2], *[_ONE] * (len(x) - 2))
        if op == "Expand":
            shape = self.value(inputs[1])
            if shape is None:
                return None
            return self._broadcast([self.dims(inputs[0]), shape[1]])
        if op == "ConstantOfShape":
            shape = self.value(inputs[0])
            return None if shape is None else shape[1]
        if op == "Split":
            return self._split(inputs, attributes, index, len(node.output))
        if op == "Einsum":
            return self._einsum([self.dims(i) for i in inputs], attributes["equation"])
        return None

    def _broadcast(self, shapes) -> tuple[Size, ...] | None:
        if any(s is None for s in shapes):
            return None
        rank = max((len(s) for s in shapes), default=0)
        out = []
        for axis in range(rank):
            sizes = {s[len(s) - rank + axis] for s in shapes if len(s) - rank + axis >= 0}
            sizes.discard(_ONE)
            if not sizes:
                out.append(_ONE)
            elif len(sizes) == 1:
                out.append(sizes.pop())
            else:  # unequal monomials can still be equal numbers; nothing to prove
                out.append(self.fresh())
        return tuple(out)

    def _reshape(self, inputs, attributes):
        x, target = self.dims(inputs[0]), self.value(inputs[1])
        if target is None or len(target[0]) != 1:
            return None
        out: list[Size | None] = []
        for axis, size in enumerate(target[1]):
            if size == (0, ()) and not attributes.get("allowzero", 0):
                if x is None or axis >= len(x):
                    return None
                out.append(x[axis])
            elif size == (-1, ()):
                out.append(None)
            else:
                out.append(size)
        if out.count(None) == 1:
            known = _product(s for s in out if s is not None)
            inferred = None if x is None else _quotient(_product(x), known)
            out[out.index(None)] = inferred or self.fresh()
        if None in out:
            return None
        return tuple(out)

    def _axes(self, inputs, attributes, rank: int) -> list[int] | None:
        if len(inputs) > 1 and inputs[1]:
            axes = self.value(inputs[1])
            if axes is None or any(a[1] for a in axes[1]):
                return None
            return sorted(a[0] % rank for a in axes[1])
        if "axes" in attributes:
            return sorted(a % rank for a in attributes["axes"])
        return None

    def _squeeze(self, op: str, inputs, attributes):
        x = self.dims(inputs[0])
        if x is None:
            return None
        if op == "Squeeze":
            axes = self._axes(inputs, attributes, len(x))
            if axes is None:
                if any(s[1] for s in x):  # a symbol may be 1 at run time
                    return None
                axes = [i for i, s in enumerate(x) if s == _ONE]
            return tuple(s for i, s in enumerate(x) if i not in axes)
        axes = self._axes(inputs, attributes, len(x) + self._count_axes(inputs, attributes))
        if axes is None:
            return None
        out, rest = [], iter(x)
        for i in range(len(x) + len(axes)):
            out.append(_ONE if i in axes else next(rest))
        return tuple(out)

    def _count_axes(self, inputs, attributes) -> int:
        if len(inputs) > 1 and inputs[1]:
            axes = self.value(inputs[1])
            return 0 if axes is None else len(axes[1])
        return len(attributes.get("axes", []))

    def _slice(self, inputs):
        x = self.dims(inputs[0])
        if x is None:
            return None
        starts, ends = self.value(inputs[1]), self.value(inputs[2])
        axes = self.value(inputs[3]) if len(inputs) > 3 and inputs[3] else None
        steps = self.value(inputs[4]) if len(inputs) > 4 and inputs[4] else None
        if starts is None or ends is None:
            return None
        if len(inputs) > 3 and inputs[3] and axes is None:
            return None
        count = len(starts[1])
        axes_list = [(a, ()) for a in range(count)] if axes is None else axes[1]
        out = list(x)
        for position in range(count):
            axis = axes_list[position]
            if axis[1]:
                return None
            axis = axis[0] % len(x)
            start, end = starts[1][position], ends[1][position]
            step = _ONE if steps is None else steps[1][position]
            whole = start == (0, ()) and step == _ONE and not end[1] and end[0] >= 2**31 - 1
            if whole:
                continue
            if not (start[1] or end[1] or step[1] or x[axis][1]):
                out[axis] = (len(range(*slice(start[0], end[0], step[0]).indices(x[axis][0]))), ())
            else:
                out[axis] = self.fresh()
        return tuple(out)

    def _concat(self, shapes, axis: int):
        if any(s is None for s in shapes) or not shapes:
            return None
        rank = len(shapes[0])
        axis %= rank
        out = list(shapes[0])
        joined = [s[axis] for s in shapes]
        if all(not s[1] for s in joined):
            out[axis] = (sum(s[0] for s in joined), ())
        else:
            out[axis] = self.fresh()
        return tuple(out)

    def _split(self, inputs, attributes, index: int, outputs: int):
        x = self.dims(inputs[0])
        if x is None:
            return None
        axis = attributes.get("axis", 0) % len(x)
        sizes = None
        if len(inputs) > 1 and inputs[1]:
            given = self.value(inputs[1])
            sizes = None if given is None else [s for s in given[1]]
        elif "split" in attributes:
            sizes = [(int(s), ()) for s in attributes["split"]]
        out = list(x)
        if sizes is not None and len(sizes) == outputs:
            out[axis] = sizes[index]
        elif not x[axis][1] and x[axis][0] % outputs == 0:
            out[axis] = (x[axis][0] // outputs, ())
        else:
            out[axis] = self.fresh()
        return tuple(out)

    def _einsum(self, shapes, equation: str):
        if any(s is None for s in shapes) or "..." in equation:
            return None
        left, _, right = equation.replace(" ", "").partition("->")
        terms = left.split(",")
        if not right and "->" not in equation:
            return None
        sizes: dict[str, set] = {}
        for term, shape in zip(terms, shapes, strict=False):
            if len(term) != len(shape):
                return None
            for letter, size in zip(term, shape, strict=True):
                sizes.setdefault(letter, set()).add(size)
        out = []
        for letter in right:
            if letter not in string.ascii_letters:
                return None
            found = sizes.get(letter, set()) - {_ONE}
            out.append(found.pop() if len(found) == 1 else (_ONE if not found else self.fresh()))
        return tuple(out)

    # -- values ----------------------------------------------------------------------

    def value(self, tensor: str) -> Value | None:
        """`(shape, elements)` of a small integer tensor whose elements are sizes, or None."""
        if tensor not in self._values:
            self._values[tensor] = None
            self._values[tensor] = self._find_value(tensor)
        return self._values[tensor]

    def _find_value(self, tensor: str) -> Value | None:
        array = self.constant(tensor)
        if array is not None:
            if array.dtype.kind not in "iu" or array.size > _SMALL:
                return None
            return tuple(array.shape), tuple((int(v), ()) for v in array.reshape(-1))
        made = self.producer(tensor)
        if made is None:
            return None
        node, index = made
        if node.domain not in ("", "ai.onnx") or index:
            return None
        op, inputs = node.op_type, list(node.input)
        attributes = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        if op == "Shape":
            x = self.dims(inputs[0])
            if x is None:
                return None
            start, end = attributes.get("start", 0), attributes.get("end", len(x))
            picked = x[slice(start, end)]
            return (len(picked),), tuple(picked)
        if op in ("Identity", "Cast"):
            if op == "Cast" and attributes["to"] not in _INT_TYPES:
                return None
            return self.value(inputs[0])
        if op in ("Squeeze", "Unsqueeze", "Reshape", "Flatten"):
            given = self.value(inputs[0])
            shape = self.dims(node.output[0])
            if given is None or shape is None or any(s[1] for s in shape):
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
            return ((1,) if keep else ()), (_product(given[1]),)
        if op in ("Max", "Min", "Mul", "Add", "Sub"):
            return self._arithmetic(op, [self.value(i) for i in inputs])
        return None

    def _gather_value(self, inputs, attributes):
        data, indices = self.value(inputs[0]), self.constant(inputs[1])
        if data is None or indices is None or len(data[0]) != 1 or attributes.get("axis", 0):
            return None
        count = data[0][0]
        picked = [int(i) % count if -count <= int(i) < count else None for i in indices.ravel()]
        if None in picked:
            return None
        return tuple(indices.shape), tuple(data[1][i] for i in picked)

    def _slice_value(self, inputs):
        data = self.value(inputs[0])
        bounds = [self.constant(i) if i else None for i in (inputs[1:] + [""] * 4)[:4]]
        if data is None or len(data[0]) != 1 or bounds[0] is None or bounds[1] is None:
            return None
        if bounds[2] is not None and [int(a) for a in bounds[2].ravel()] not in ([0], [-1]):
            return None
        step = 1 if bounds[3] is None else int(bounds[3].ravel()[0])
        start, end = int(bounds[0].ravel()[0]), int(bounds[1].ravel()[0])
        end = min(end, 2**62)
        elements = data[1][slice(start, end, step)]
        return (len(elements),), tuple(elements)

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
                out.append(_product([x, y]))
            elif not x[1] and not y[1]:
                numbers = {"Max": max, "Min": min, "Add": int.__add__, "Sub": int.__sub__}
                out.append((numbers[op](x[0], y[0]), ()))
            else:
                return None
        return shape_a, tuple(out)
