"""Symbolic shapes of an ONNX graph: which axes of two tensors are provably the same size.

tf2onnx writes every length as `Shape(x)` of the tensor at hand, so each block of a model
reads the sequence length from its own tensors, and nothing in the file says that they are
all the graph input's. Here each axis of a tensor gets a size made of symbols: a monomial
`c * a * b ...` of the graph inputs' axes (and of fresh symbols for sizes nothing here can
follow, an `If`'s outputs for instance), and so does each element of a small integer tensor
(a shape being computed: `Shape`, `Gather`, `Concat`, `ReduceProd`, ...). Two tensors whose
axes have equal monomials have equal shapes at any input on which the graph runs: the rules
below are those of the ops' definitions, and broadcasting merges two sizes only when one is
1 or both are the same monomial. `cse` merges `Shape(a)` and `Shape(b)` on that proof.
"""

from __future__ import annotations

import itertools
import string
from collections.abc import Callable

import numpy as np
import onnx
from onnx import helper

from keras_posenc.export.onnx_passes.sizes import (
    ONE,
    Size,
    Value,
    constant_value,
    product,
    quotient,
    slice_indices,
    zero_only_with,
)
from keras_posenc.export.onnx_passes.values import ShapeValues

__all__ = ["SHAPE_FROM_SHAPES", "SHAPE_FROM_VALUES", "SymbolicShapes", "constant_value"]

# Ops whose first output has the shape of their first input.
SAME_SHAPE = {
    *"Abs Neg Sqrt Reciprocal Exp Log Erf Tanh Sigmoid Relu Cast Identity Not Sin Cos".split(),
    *"Floor Ceil Round Sign Softmax LogSoftmax Gelu Elu LeakyRelu HardSigmoid IsNaN".split(),
    *"IsInf Softplus Softsign HardSwish Mish Selu Celu ThresholdedRelu Clip".split(),
    "LayerNormalization",
    "RMSNormalization",
    "RotaryEmbedding",
}
# Ops whose output has the broadcast shape of their inputs.
BROADCAST = {
    *"Add Sub Mul Div Pow Max Min Mod Equal Less Greater LessOrEqual GreaterOrEqual".split(),
    *"And Or Xor Where PRelu BitShift Sum Mean".split(),
}
# Ops of onnxruntime's domain whose first output has the shape of their first input.
_MICROSOFT_SAME_SHAPE = {"RotaryEmbedding", "FastGelu", "BiasGelu", "Gelu", "QuickGelu"}
# Ops (ONNX domain) whose output shapes follow from their attributes and the shapes of
# their inputs alone: two such nodes of equal attributes on inputs of equal shapes make
# outputs of equal shapes (what `cse` proves where the axes' sizes are not known).
SHAPE_FROM_SHAPES = {
    *SAME_SHAPE,
    *BROADCAST,
    *"MatMul Gemm Transpose Gather Einsum Concat GlobalAveragePool GlobalMaxPool".split(),
}
# ...and those whose output shape also follows from the values of these inputs.
SHAPE_FROM_VALUES = {
    "Reshape": (1,),
    "Squeeze": (1,),
    "Unsqueeze": (1,),
    "Slice": (1, 2, 3, 4),
    "Expand": (1,),
}


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
        self._values = ShapeValues(self)
        self._fresh = itertools.count()

    @classmethod
    def of_graph(cls, graph: onnx.GraphProto) -> SymbolicShapes:
        """The sizes of the tensors of `graph` (a main graph: it reads no outer tensor)."""
        producers = {o: (n, i) for n in graph.node for i, o in enumerate(n.output) if o}
        inputs = {i.name: i.type for i in graph.input}
        # An initializer that is also an input is a default: it can be fed another shape.
        initializers = {t.name: t for t in graph.initializer if t.name not in inputs}

        def constant(tensor: str) -> np.ndarray | None:
            return constant_value(tensor, initializers, producers)

        return cls(producers.get, constant, inputs.get)

    def value(self, tensor: str) -> Value | None:
        """`(shape, elements)` of a small integer tensor whose elements are sizes, or None."""
        return self._values.value(tensor)

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
        if op in SAME_SHAPE:
            return self.dims(inputs[0]) if index == 0 else None
        if op in BROADCAST:
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
            return self.reshape_dims(inputs, attributes)
        if op in ("Squeeze", "Unsqueeze"):
            return self.squeeze_dims(op, inputs, attributes)
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
            return None if x is None else (*x[:2], *[ONE] * (len(x) - 2))
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
            sizes.discard(ONE)
            if not sizes:
                out.append(ONE)
            elif len(sizes) == 1:
                out.append(sizes.pop())
            else:  # unequal monomials can still be equal numbers; nothing to prove
                out.append(self.fresh())
        return tuple(out)

    def reshape_dims(self, inputs, attributes):
        """The axes of `Reshape(*inputs)` (also of a shape being computed, for `values`)."""
        x, target = self.dims(inputs[0]), self.value(inputs[1])
        if target is None or len(target[0]) != 1:
            return None
        copies_zeros = not attributes.get("allowzero", 0)
        out: list[Size | None] = []
        for axis, size in enumerate(target[1]):
            if size == (-1, ()):
                out.append(None)
            elif not copies_zeros or (size[0] and not size[1]):
                out.append(size)
            elif x is None or axis >= len(x):
                return None
            elif size == (0, ()) or zero_only_with(size, x[axis]):
                # A 0 copies the input's axis (allowzero=0): a size that can be 0 only
                # when that axis is 0 comes out the same either way.
                out.append(x[axis] if size == (0, ()) else size)
            else:
                out.append(self.fresh())
        if out.count(None) == 1:
            known = product(s for s in out if s is not None)
            inferred = None if x is None else quotient(product(x), known)
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

    def squeeze_dims(self, op: str, inputs, attributes):
        """The axes of `Squeeze` / `Unsqueeze(*inputs)` (also for `values`)."""
        x = self.dims(inputs[0])
        if x is None:
            return None
        if op == "Squeeze":
            axes = self._axes(inputs, attributes, len(x))
            if axes is None and len(inputs) > 1 and inputs[1]:
                return None  # axes known only at run time
            if axes is None:
                if any(s[1] for s in x):  # a symbol may be 1 at run time
                    return None
                axes = [i for i, s in enumerate(x) if s == ONE]
            return tuple(s for i, s in enumerate(x) if i not in axes)
        axes = self._axes(inputs, attributes, len(x) + self._count_axes(inputs, attributes))
        if axes is None:
            return None
        out, rest = [], iter(x)
        for i in range(len(x) + len(axes)):
            out.append(ONE if i in axes else next(rest))
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
        for position in (3, 4):  # axes, steps: given, but known only at run time
            if len(inputs) > position and inputs[position] and (axes, steps)[position - 3] is None:
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
            step = ONE if steps is None else steps[1][position]
            whole = start == (0, ()) and step == ONE and not end[1] and end[0] >= 2**31 - 1
            if whole:
                continue
            picked = None
            if not (start[1] or end[1] or step[1] or x[axis][1]):
                picked = slice_indices(start[0], end[0], step[0], x[axis][0])
            if picked is not None:
                out[axis] = (len(picked), ())
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
            if given is None:
                return None  # sizes known only at run time
            sizes = list(given[1])
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

    def _einsum(self, shapes, equation: str | bytes):
        if isinstance(equation, bytes):
            equation = equation.decode()
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
            found = sizes.get(letter, set()) - {ONE}
            out.append(found.pop() if len(found) == 1 else (ONE if not found else self.fresh()))
        return tuple(out)
