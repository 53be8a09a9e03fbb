"""The ONNX nodes of the weights Keras quantized (`keras_quantized.py`), as stored.

- int8 (`KerasInt8`): Keras's arithmetic in standard ops, since no contrib op rounds the
  inputs as Keras does (MatMulNBits' `accuracy_level` 4 rounds per block, to another
  scale): per row `s = 127 / (ReduceMax(Abs(x)) + 1e-7)`, `x_q = Clip(Round(x * s), -127,
  127)` (Round is half to even, as Keras's), `MatMulInteger(Cast<uint8>(x_q + 128), q,
  a_zero_point=128)` (exact int32, as Keras's int8 product), `Cast<float>`, then divided by
  `scale * s`. A layer
  Keras runs without input quantization: `MatMul(x, Cast<float>(q)) / scale`.
- int4 blocks (`quantize.Quantized` with zero points): `com.microsoft.MatMulNBits` with
  `zero_points`; the stored K when it is not a whole number of blocks.
- GPTQ / AWQ (`keras_gptq.KerasGrouped`): the input's rows gathered into group order
  (`Gather`, exact) where GPTQ's activation order permuted them, divided by AWQ's scales
  (`Div`, as Keras divides the weight's rows), then MatMulNBits (4 or 8 bits) with zero
  points. Kernels packed into one projection whose inputs are reordered or divided alike
  are one MatMulNBits; otherwise one each, concatenated (`Concat`, exact).
- The embedding: int8 `Gather(q) / Gather(scale)`; int4 the table's bytes gathered, their
  nibbles split (`BitwiseAnd`, `BitShift`) and `(q - zero) * scale` per block. A tied head
  reads the same initializers (one copy of the table).

q/k/v kernels packed into one projection are their stored forms side by side along N
(each output channel keeps its own scale; the input rounding is per row, the same).
"""

from __future__ import annotations

import dataclasses

import numpy as np
from onnx import TensorProto

from keras_posenc.export.decoder.graph_builder import MICROSOFT, GraphBuilder
from keras_posenc.export.decoder.keras_gptq import KerasGrouped
from keras_posenc.export.decoder.keras_quantized import KerasInt8
from keras_posenc.export.decoder.quantize import Quantized


def _alike(arrays: list) -> bool:
    first = arrays[0]
    if first is None:
        return all(a is None for a in arrays)
    return all(a is not None and np.array_equal(a, first) for a in arrays)


def concatenated(parts: list):
    """The stored forms of kernels side by side along N (one projection of several); a
    tuple of them where they cannot be one product (`stored_matmul` concatenates those)."""
    first = parts[0]
    if isinstance(first, KerasGrouped):
        inputs_alike = _alike([p.order for p in parts]) and _alike([p.divisor for p in parts])
        same = {(p.bits, p.block_size, p.shape[0]) for p in parts}
        if not inputs_alike or len(same) > 1:
            return tuple(parts)
        quantized = concatenated([p.quantized for p in parts])
        return dataclasses.replace(first, quantized=quantized)
    if isinstance(first, KerasInt8):
        if any(p.activation != first.activation for p in parts):
            raise ValueError("packed int8 kernels quantize their inputs alike.")
        return KerasInt8(
            np.concatenate([p.integers for p in parts], axis=1),
            np.concatenate([p.scales for p in parts]),
            first.activation,
        )
    return dataclasses.replace(
        first,
        packed=np.concatenate([p.packed for p in parts]),
        scales=np.concatenate([p.scales for p in parts]),
        zero_points=np.concatenate([p.zero_points for p in parts]),
    )


def _int8_initializers(g: GraphBuilder, stored: KerasInt8, name: str) -> tuple[str, str]:
    cached = getattr(g, "stored_names", {})
    if id(stored) not in cached:
        q = g.initializer(f"{name}.MatMul.weight_int8", stored.integers)
        scales = g.initializer(f"{name}.MatMul.weight_scale", stored.scales)
        cached[id(stored)] = (stored, q, scales)
        g.stored_names = cached
    return cached[id(stored)][1:]


def _int8_matmul(g: GraphBuilder, x: str, stored: KerasInt8, name: str, outputs) -> str:
    q, scales = _int8_initializers(g, stored, name)
    if stored.activation is None:
        product = g.node("MatMul", [x, g.node("Cast", [q], to=TensorProto.FLOAT)])
        return g.node("Div", [product, scales], outputs)
    low, high, epsilon = stored.activation
    largest = g.node("ReduceMax", [g.node("Abs", [x]), g.constant([-1], np.int64)], keepdims=1)
    step = g.node(
        "Div",
        [g.constant(high, np.float32), g.node("Add", [largest, g.constant(epsilon, np.float32)])],
    )
    rounded = g.node("Round", [g.node("Mul", [x, step])])
    clipped = g.node("Clip", [rounded, g.constant(low, np.float32), g.constant(high, np.float32)])
    # As uint8 with zero point 128 (`x_q + 128`, exact): onnxruntime's fast u8 x s8 kernel;
    # its int8 x int8 one is several times slower.
    shifted = g.node("Add", [clipped, g.constant(128, np.float32)])
    x_u = g.node("Cast", [shifted], to=TensorProto.UINT8)
    product = g.node("MatMulInteger", [x_u, q, g.constant(128, np.uint8)])
    product = g.node("Cast", [product], to=TensorProto.FLOAT)
    return g.node("Div", [product, g.node("Mul", [scales, step])], outputs)


def _nbits_initializers(g: GraphBuilder, stored: Quantized, name: str) -> tuple:
    cached = getattr(g, "stored_names", {})
    if id(stored) not in cached:
        names = (
            g.initializer(f"{name}.MatMul.weight_Q4", stored.packed),
            g.initializer(f"{name}.MatMul.weight_scales", stored.scales),
            g.initializer(f"{name}.MatMul.weight_zp", stored.zero_points),
        )
        cached[id(stored)] = (stored, *names)
        g.stored_names = cached
    return cached[id(stored)][1:]


def stored_matmul(g: GraphBuilder, x: str, stored, name: str, outputs=1) -> str:
    """`x @ kernel` as Keras computes it from `stored` (module docstring)."""
    if isinstance(stored, tuple):  # kernels side by side that are not one product
        products = [stored_matmul(g, x, part, f"{name}.{i}") for i, part in enumerate(stored)]
        return g.node("Concat", products, outputs, axis=-1)
    if isinstance(stored, KerasInt8):
        return _int8_matmul(g, x, stored, name, outputs)
    if isinstance(stored, KerasGrouped):
        x = _grouped_input(g, x, stored, name)
        stored = stored.quantized
    k, n = stored.shape
    return g.node(
        "MatMulNBits",
        [x, *_nbits_initializers(g, stored, name)],
        outputs,
        domain=MICROSOFT,
        K=k,
        N=n,
        bits=stored.bits,
        block_size=stored.block_size,
        accuracy_level=g.quantization.accuracy_level,
    )


def _grouped_input(g: GraphBuilder, x: str, stored: KerasGrouped, name: str) -> str:
    """`x[..., order] / divisor` (`KerasGrouped`): what its MatMulNBits multiplies."""
    if stored.order is not None:
        order = g.initializer(f"{name}.MatMul.input_order", stored.order.astype(np.int64))
        x = g.node("Gather", [x, order], axis=-1)
    if stored.divisor is not None:
        x = g.node("Div", [x, g.initializer(f"{name}.MatMul.awq_scales", stored.divisor)])
    return x


def _nibbles(g: GraphBuilder, packed: str, length: int) -> str:
    """uint8 `(..., bytes)` -> float32 `(..., length)`: low nibble first."""
    low = g.node("BitwiseAnd", [packed, g.constant(15, np.uint8)])
    high = g.node("BitShift", [packed, g.constant(4, np.uint8)], direction="RIGHT")
    pairs = g.node(
        "Concat",
        [g.node("Unsqueeze", [part, g.constant([-1], np.int64)]) for part in (low, high)],
        axis=-1,
    )
    flat = g.node("Reshape", [pairs, g.constant([0, 0, -1], np.int64)])
    return g.node("Cast", [_first(g, flat, length)], to=TensorProto.FLOAT)


def _first(g: GraphBuilder, x: str, length: int) -> str:
    """The first `length` entries of `x`'s last axis."""
    ends = g.constant([length], np.int64)
    return g.node("Slice", [x, g.constant([0], np.int64), ends, g.constant([-1], np.int64)])


def stored_embedding(g: GraphBuilder, table, ids: str) -> str:
    """The embedded tokens `(batch, sequence, width)` from the stored table (`KerasInt8`
    of the head's `(width, vocabulary)` layout, or a `Quantized` with K the width)."""
    if isinstance(table, KerasInt8):
        q, scales = _int8_initializers(g, table, "embed_tokens")
        rows = g.node("Gather", [q, ids], axis=1)  # (width, batch, sequence)
        rows = g.node("Cast", [g.node("Transpose", [rows], perm=[1, 2, 0])], to=TensorProto.FLOAT)
        scale = g.node("Unsqueeze", [g.node("Gather", [scales, ids]), g.constant([-1], np.int64)])
        return g.node("Div", [rows, scale])
    packed, scales, zeros = _nbits_initializers(g, table, "embed_tokens")
    width, vocabulary = table.shape
    _, blocks, per_block = table.packed.shape
    flat = g.node("Reshape", [packed, g.constant([vocabulary, blocks * per_block], np.int64)])
    values = _nibbles(g, g.node("Gather", [flat, ids]), blocks * table.block_size)
    zero = _nibbles(g, g.node("Gather", [zeros, ids]), blocks)
    scale = g.node("Gather", [scales, ids])
    by_block = g.node("Reshape", [values, g.constant([0, 0, blocks, table.block_size], np.int64)])
    shift = g.node("Unsqueeze", [zero, g.constant([-1], np.int64)])
    times = g.node("Unsqueeze", [scale, g.constant([-1], np.int64)])
    rows = g.node("Mul", [g.node("Sub", [by_block, shift]), times])
    rows = g.node("Reshape", [rows, g.constant([0, 0, blocks * table.block_size], np.int64)])
    return _first(g, rows, width)


def without_input_rounding(model) -> None:
    """Rewrites `model` (an `onnx.ModelProto`, in place) so that each int8 product takes
    its inputs unrounded: `MatMulInteger(x_q, q)` becomes `MatMul(x * s, Cast<float>(q))`
    (then divided by `scale * s` as before): Keras's int8 arithmetic without the input
    rounding, which its model computes with its `inputs_quantizer`s off
    (`keras_quantized.unrounded_inputs`). The weights are then judged to float32
    tolerance, which the rounding's bound is too wide to do."""
    from onnx import helper

    producer = {output: node for node in model.graph.node for output in node.output}
    nodes = []
    for node in model.graph.node:
        if node.op_type == "MatMulInteger":
            rounded = producer[node.input[0]]  # Cast <- Add <- Clip <- Round <- Mul(x, s)
            while rounded.op_type != "Round":
                rounded = producer[rounded.input[0]]
            scaled = producer[rounded.input[0]]
            weights = f"{node.input[1]}_float"
            nodes.append(helper.make_node("Cast", [node.input[1]], [weights], to=TensorProto.FLOAT))
            node = helper.make_node("MatMul", [scaled.output[0], weights], list(node.output))
        nodes.append(node)
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    used = {name for node in nodes for name in node.input}  # the zero point 128 is not
    kept = [tensor for tensor in model.graph.initializer if tensor.name in used]
    del model.graph.initializer[:]
    model.graph.initializer.extend(kept)
