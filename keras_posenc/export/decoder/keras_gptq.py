"""Layers Keras quantized with GPTQ or AWQ (`model.quantize("gptq" | "awq", config=...)`),
read as they are stored (never re-quantized, only repacked).

Keras 3.15 stores, for a Dense / EinsumDense of float kernel `(K, N)` (an EinsumDense's
kernel flattened to Keras's `(rows, columns)`):

- `quantized_kernel` uint8 `(N, K)`, the *transposed* kernel: at 4 bits two values a byte
  along N (`pack_int4(axis=0)`, the lower N in the low nibble), `(ceil(N / 2), K)`; at 2,
  3 and 8 bits one value a byte. The values are unsigned, `[0, 2^bits)`.
- `kernel_scale` float32 and `kernel_zero` uint8 `(N, groups)`, `groups = ceil(K / group)`
  (one group, `group_size=-1`: one scale per output channel). The zero point is
  `round(-min / scale)`, not clipped: a group whose weights are all of one sign has one
  outside `[0, 2^bits)` (uint8 wraps a negative one; Keras computes with the wrapped one).
- `g_idx` float32 `(K,)`: input row `k` takes group `int(g_idx[k])` (Keras casts it to
  int32: truncation; GPTQ writes `k / group`, fractions included). With
  `activation_order=True` the rows are quantized in another order and `g_idx` is that
  order's groups mapped back: each group is `group` rows, not contiguous ones.
- AWQ also `awq_scales` float32 `(K,)`.

The forward pass: `w[k, n] = (q[n, k] - zero[n, g]) * scale[n, g]` in float32 (`g` the
row's group), for AWQ then `w[k, n] / awq_scales[k]`, and `y = x @ w` (inputs not
rounded). Exported as `KerasGrouped`: `x[..., order] / divisor` (an exact `Gather` of the
input rows into group order, then AWQ's `Div`) times a `quantize.Quantized` of the rows in
that order (MatMulNBits with zero points: its blocks are the groups, contiguous there; 4
bits where every integer and zero point is below 16, else the same integers at 8 bits).
Keras divides the weight by `awq_scales`, the file the input: per product term the same
two float32 roundings, in another order (within the float32 bound of the product).

Refused by name: a `g_idx` that is not a permutation of whole groups (each `group` rows,
the last the rest), a group that is not a power of 2 >= 16 (MatMulNBits' blocks; one group
is written as one block of the next power of 2, padded rows weighing 0), an EinsumDense
whose Keras row split is not its contracted axes. A layer that was never calibrated (its
block not in the quantization structure) computes with its float kernel, and is read as
a float layer (`uncalibrated`).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from keras_posenc.backend.keras_private import quantized_part
from keras_posenc.export.decoder.quantize import (
    MIN_BLOCK,
    Quantized,
    asymmetric,
    dequantize,
    nibbles,
)
from keras_posenc.export.decoder.weight_arrays import weight_array
from keras_posenc.export.errors import ExportError

GROUPED_MODES = ("gptq", "awq")


@dataclasses.dataclass(frozen=True)
class KerasGrouped:
    """A GPTQ / AWQ kernel as the file computes it: `x[..., order] / divisor` (None: not
    reordered / not divided) times `quantized`, whose rows are in `order`; `mode` Keras's
    ("gptq", "awq")."""

    mode: str
    quantized: Quantized
    order: np.ndarray | None
    divisor: np.ndarray | None

    @property
    def shape(self) -> tuple[int, int]:
        return self.quantized.shape

    @property
    def bits(self) -> int:
        return self.quantized.bits

    @property
    def block_size(self) -> int:
        return self.quantized.block_size


def uncalibrated(layer) -> bool:
    """Whether `layer` is GPTQ / AWQ but was never calibrated: Keras then computes with its
    float kernel (a layer with no such flag, not Keras's Dense / EinsumDense, is not)."""
    mode = getattr(layer, "quantization_mode", None)
    return mode in GROUPED_MODES and getattr(layer, f"is_{mode}_calibrated", None) is False


def float_kernel_shape(layer) -> tuple:
    """The shape of the float kernel Keras computes with (a GPTQ / AWQ layer's `kernel`
    property gives its stored integers)."""
    if getattr(layer, "quantization_mode", None) in GROUPED_MODES and not uncalibrated(layer):
        return tuple(getattr(layer, "original_kernel_shape", None) or layer.kernel_shape)
    return tuple(layer.kernel.shape)


def block_order(g_idx: np.ndarray, block: int, what: str) -> np.ndarray | None:
    """The order that puts the input rows of `g_idx` (each row's group, as Keras reads it:
    truncated to an integer) in whole blocks of `block` rows: None if they are already.

    Raises:
        ExportError: the groups are not a permutation of whole blocks (`what` names the layer).
    """
    length = g_idx.shape[0]
    g_idx = np.asarray(g_idx, np.float64)
    groups = np.trunc(g_idx) if np.all(np.isfinite(g_idx)) else np.full(length, -1.0)
    order = np.argsort(groups, kind="stable")
    if not np.array_equal(groups[order], np.arange(length) // block):
        raise ExportError(
            f"{what}'s g_idx is not a permutation of whole blocks of {block} rows; not exported."
        )
    return None if np.array_equal(order, np.arange(length)) else order


def _bits(layer, what: str) -> int:
    """The layer's weight bits as its GPTQ / AWQ dtype policy says (never a guess)."""
    bits = getattr(layer.dtype_policy, "weight_bits", None)
    if bits is None:
        raise ExportError(
            f"{what}'s dtype policy {layer.dtype_policy!r} names no weight_bits; its stored "
            "integers cannot be read. Quantize it with Keras's GPTQConfig / AWQConfig."
        )
    return int(bits)


def _integers(layer, bits: int, n: int) -> np.ndarray:
    """The unsigned integers `q` `(K, N)` of `quantized_kernel` (`(N, K)`, packed along N)."""
    stored = np.asarray(weight_array(layer.quantized_kernel), np.uint8).T  # (K, N packed)
    return np.ascontiguousarray(nibbles(stored)[:, :n] if bits == 4 else stored)


def _block(layer, length: int, groups: int, what: str) -> tuple[int, int]:
    """`(group, MatMulNBits block)`: the group size of the layer's policy (`group_size`;
    without one, what the groups' count implies); one group is a block of the next power
    of 2 >= K."""
    if groups == 1:
        return length, max(MIN_BLOCK, 1 << (length - 1).bit_length())
    group = int(getattr(layer.dtype_policy, "group_size", None) or -(-length // groups))
    if group < MIN_BLOCK or group & (group - 1) or -(-length // group) != groups:
        raise ExportError(
            f"{what}: groups of {group} rows, not a power of 2 >= {MIN_BLOCK} (MatMulNBits' "
            "blocks); quantize with such a group_size, or export the float model."
        )
    return group, group


def _check_rows(layer, k: int, what: str) -> None:
    """An EinsumDense whose Keras row split is not its contracted axes is refused."""
    axes = quantized_part(layer, "kernel_reduced_axes")
    shape = float_kernel_shape(layer)
    if axes is not None and int(np.prod(shape[: len(axes)])) != k:
        raise ExportError(
            f"{what}: Keras's {layer.quantization_mode} splits its kernel {shape} into {k} "
            "rows, not its contracted axes; not exported."
        )


def read_grouped(layer, owner: str) -> tuple[KerasGrouped, np.ndarray]:
    """`(stored, float (K, N))` of a calibrated GPTQ / AWQ Dense or EinsumDense: the float
    kernel is what Keras computes with (module docstring)."""
    what = f"{owner}: {layer.name!r}"
    g_idx = np.asarray(weight_array(layer.g_idx))
    scales = np.asarray(weight_array(layer.kernel_scale), np.float32)  # (N, groups)
    n, groups = scales.shape
    _check_rows(layer, g_idx.shape[0], what)
    bits = _bits(layer, what)
    group, block = _block(layer, g_idx.shape[0], groups, what)
    order = block_order(g_idx, group, what)
    q = _integers(layer, bits, n)
    zeros = weight_array(layer.kernel_zero).T
    rows = q if order is None else q[order]
    # Keras's unsigned zero point is round(-min / scale), not clipped: a group whose
    # weights are all of one sign has one past 2^bits - 1 (uint8 holds it, wrapped where
    # negative). Such a layer's integers go in MatMulNBits' 8-bit form, unchanged.
    fits = bits <= 4 and max(q.max(initial=0), zeros.max(initial=0)) <= 15
    quantized = asymmetric(rows, scales.T, zeros, block, 4 if fits else 8)
    divisor = None
    if layer.quantization_mode == "awq":
        divisor = np.asarray(weight_array(layer.awq_scales), np.float32)
        divisor = divisor if order is None else divisor[order]
    stored = KerasGrouped(layer.quantization_mode, quantized, order, divisor)
    return stored, grouped_dequantized(stored)


def grouped_dequantized(stored: KerasGrouped) -> np.ndarray:
    """The float32 `(K, N)` weight Keras computes with, in its own row order:
    `(q - zero) * scale`, divided by AWQ's scale."""
    w = dequantize(stored.quantized)
    if stored.divisor is not None:
        w = (w / stored.divisor[:, None]).astype(np.float32)
    if stored.order is None:
        return w
    unordered = np.empty_like(w)
    unordered[stored.order] = w
    return unordered
