"""Quantized weights in the standard-op graph: `DequantizeLinear` with `block_size`, then `MatMul`.

A `quantize.Quantized` kernel `(K, N)` is written as ONNX's own ops (opset 21+; the
standard-op graph is opset 23): its integers as one `(K, N)` initializer, its scales as
`(K / block_size, N)` float32, and `DequantizeLinear(axis=0, block_size)` making the float
kernel a `MatMul` reads. The same numbers as MatMulNBits' `(q - 2^(bits-1)) * scale`:

- symmetric (no zero points): `q - 2^(bits-1)` as `int4` / `int8`, no zero point input
  (DequantizeLinear's default 0), so nothing but the integers and scales is stored;
- with zero points (a `zero_points` attribute of the record that is not None, `(N, blocks)`
  or, 4 bits, MatMulNBits' packed `(N, ceil(blocks / 2))`): `q` as `uint4` / `uint8` and the
  zero points as DequantizeLinear's third input, `(K / block_size, N)` of the same type.

`int4` / `uint4` initializers hold ONNX's packing: the `(K, N)` tensor in row-major order,
two elements a byte, the first in the low nibble (not MatMulNBits' packing along K).

onnxruntime (1.32, CPU) fuses `DequantizeLinear` + `MatMul` into `com.microsoft.MatMulNBits`
where the integers and scales have no other consumer, with the session's
`session.qdq_matmulnbits_accuracy_level` (default 4: int8 activations);
docs/quantization.md gives what it fuses and its speed.
"""

from __future__ import annotations

import numpy as np
from onnx import TensorProto

from keras_posenc.export.decoder.graph_builder import GraphBuilder
from keras_posenc.export.decoder.quantize import Quantized, unpacked

# The onnxruntime session option that sets the accuracy level of a fused MatMulNBits.
FUSED_ACCURACY_LEVEL = "session.qdq_matmulnbits_accuracy_level"

_TYPES = {  # (bits, with zero points) -> DequantizeLinear's integer type
    (4, False): TensorProto.INT4,
    (8, False): TensorProto.INT8,
    (4, True): TensorProto.UINT4,
    (8, True): TensorProto.UINT8,
}


def _zero_points(zero_points, stored: Quantized) -> np.ndarray:
    """The zero points `(N, blocks)` as integers, from either layout the module names."""
    zero_points = np.asarray(zero_points)
    n, blocks = stored.scales.shape
    if zero_points.shape == (n, blocks):
        return zero_points.astype(np.int16)
    if stored.bits == 4 and zero_points.shape == (n, (blocks + 1) // 2):
        nibbles = np.stack([zero_points & 15, zero_points >> 4], axis=-1).reshape(n, -1)
        return nibbles[:, :blocks].astype(np.int16)
    raise ValueError(
        f"zero_points of shape {zero_points.shape} for scales {stored.scales.shape}: expected "
        f"{(n, blocks)} or, 4 bits, MatMulNBits' packed {(n, (blocks + 1) // 2)}."
    )


def standard_integers(stored: Quantized) -> tuple[np.ndarray, np.ndarray | None]:
    """`(integers (K, N), zero points (K / block_size, N) or None)`, int16, the values
    DequantizeLinear reads (module docstring): `q - 2^(bits-1)`, or `q` and its zero points."""
    k, n = stored.shape
    q = unpacked(stored).reshape(n, k).T.astype(np.int16)
    zero_points = getattr(stored, "zero_points", None)
    if zero_points is None:
        return q - (1 << (stored.bits - 1)), None
    return q, np.ascontiguousarray(_zero_points(zero_points, stored).T)


def _raw(values: np.ndarray, bits: int, signed: bool) -> np.ndarray:
    """The stored bytes of `values`: 8 bits as int8 / uint8, 4 bits packed as ONNX packs them."""
    if bits == 8:
        return values.astype(np.int8 if signed else np.uint8)
    flat = (values.reshape(-1) & 15).astype(np.uint8)
    if flat.size % 2:
        flat = np.append(flat, np.uint8(0))
    return (flat[0::2] | (flat[1::2] << 4)).astype(np.uint8)


def _integer_initializer(g: GraphBuilder, name: str, values: np.ndarray, bits: int, signed: bool):
    data_type = _TYPES[bits, not signed]
    return g.initializer(name, _raw(values, bits, signed), data_type=data_type, dims=values.shape)


def _dequantize_inputs(g: GraphBuilder, stored: Quantized, name: str) -> list[str]:
    """`[integers, scales]` (and zero points) initializers of `stored`, DequantizeLinear's."""
    integers, zero_points = standard_integers(stored)
    signed, bits = zero_points is None, stored.bits
    inputs = [
        _integer_initializer(g, f"{name}.weight_q{bits}", integers, bits, signed),
        g.initializer(f"{name}.weight_scales", np.ascontiguousarray(stored.scales.T)),
    ]
    if zero_points is not None:
        inputs.append(
            _integer_initializer(g, f"{name}.weight_zero_points", zero_points, bits, signed)
        )
    return inputs


def dequantized_weight(g: GraphBuilder, stored: Quantized, name: str) -> str:
    """The float32 kernel `(K, N)` of `stored`: `DequantizeLinear` over its initializers."""
    inputs = _dequantize_inputs(g, stored, name)
    return g.node("DequantizeLinear", inputs, axis=0, block_size=stored.block_size)


def tied_lookup(g: GraphBuilder, stored: Quantized, ids: str) -> tuple[str, str]:
    """`(embedded tokens (batch, sequence, K), the head's float kernel (K, N))` of a tied
    table. The embedding reads its own copy of the head's numbers: onnxruntime fuses the
    head's `DequantizeLinear` + `MatMul` only where nothing else reads its integers and
    scales. The copy is the same integers one row a token, `(N, K)`, widened to 8 bits
    (ONNX's `Gather` takes no int4; int8 holds every int4 exactly), and the same scales
    `(N, K / block_size)` (and zero points): the tokens' rows are gathered, then
    dequantized, the same values as the head's kernel's columns."""
    kernel = dequantized_weight(g, stored, "lm_head")
    integers, zero_points = standard_integers(stored)
    signed = zero_points is None
    rows = [
        _integer_initializer(g, "embed_tokens.weight_q8", integers.T, 8, signed),
        g.initializer("embed_tokens.weight_scales", np.ascontiguousarray(stored.scales)),
    ]
    if zero_points is not None:
        rows.append(
            _integer_initializer(g, "embed_tokens.weight_zero_points", zero_points.T, 8, signed)
        )
    gathered = [g.node("Gather", [x, ids]) for x in rows]  # (batch, sequence, ...)
    return g.node("DequantizeLinear", gathered, axis=-1, block_size=stored.block_size), kernel
