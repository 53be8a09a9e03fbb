"""One definition of a blockwise-quantized weight, as `com.microsoft.MatMulNBits` stores it.

A kernel `w` of shape `(K, N)` (`y = x @ w`) is cut, column by column, into blocks of
`block_size` rows along K. Each block gets one float32 `scale` and `bits`-bit integers
`q` with `w ≈ (q - zero) * scale`, `zero = 2^(bits-1)` (symmetric: no zero points are
stored). The scale is the block's value of largest magnitude, sign kept (the negative one
where `m` and `-m` tie), over `-zero` (so that value is `q = 0` exactly), and
`q = round(w / scale + zero)` (half away from zero) clipped to `[0, 2^bits - 1]`:
onnxruntime's `quantize_matmul_4bits` / `_8bits` (MLAS), which the genai builder's
`MatMulNBitsQuantizer` calls, bit for bit.

Stored: `B` uint8 `(N, K / block_size, block_size * bits / 8)` (4 bits: two per byte,
the lower K index in the low nibble), `scales` float32 `(N, K / block_size)`.

LiteRT's rule (`rule="litert"`, what its kernels take; docs/quantization.md): the scale
is positive, `max|w| / (2^(bits-1) - 1)` (XNNPACK refuses a negative one), rounded to
float16 for 4 bits (LiteRT's blockwise scales are a float16 tensor), and `q - zero` lies
in `[-(2^(bits-1) - 1), 2^(bits-1) - 1]` (symmetric, "narrow range"). The same record
holds it (`q` with `zero = 2^(bits-1)`), so `dequantize` is the one formula for both.
`block_size=None` is one block per output channel (K): LiteRT's int8 per channel.

Asymmetric blocks (`symmetric=False`, the builder's `is_symmetric=false`) store a
zero point per block: the block's range widened to hold 0, `[lo, hi] = [min(w, 0),
max(w, 0)]`, `scale = (hi - lo) / (2^bits - 1)` (positive), `zero = round(-lo / scale)`
clipped to `[0, 2^bits - 1]`, and `q = round(w * (1 / scale) + zero)` in float32 (half
away from zero), clipped: MLAS's `range2scalezp` and quantizer (what
`quantize_matmul_4bits` / `_8bits` write with `is_symmetric=False`), bit for bit. A block
of zeros (`hi == lo`) has scale 0, zero point 0 and `q = 0` (no division).

A weight Keras quantized (`keras_quantized.py`) also carries `zero_points` (asymmetric
blocks: `w = (q - zero_point) * scale`). Zero points are uint8 `(N, ceil(blocks * bits /
8))` packed as MatMulNBits reads them (4 bits: the lower block in the low nibble); `rows`
is K where that is not a whole number of blocks (the last block padded).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from keras_posenc.export.errors import ExportError

QUANTIZE_MODES = {"int4": 4, "int8": 8}
MIN_BLOCK = 16
RULES = ("mlas", "litert")


@dataclasses.dataclass(frozen=True)
class Quantized:
    """A quantized `(K, N)` kernel: `packed` `(N, blocks, block_size * bits / 8)` uint8,
    `scales` `(N, blocks)` float32; `zero_points` None (symmetric: `2^(bits-1)`) or uint8
    `(N, ceil(blocks * bits / 8))`; `rows` None (K is `blocks * block_size`) or K."""

    packed: np.ndarray
    scales: np.ndarray
    bits: int
    block_size: int
    zero_points: np.ndarray | None = None
    rows: int | None = None

    @property
    def shape(self) -> tuple[int, int]:
        """The kernel's `(K, N)`."""
        n, blocks, _ = self.packed.shape
        return (blocks * self.block_size if self.rows is None else self.rows), n


def check_block_size(block_size) -> int:
    """`block_size` as an int, or a ValueError naming what MatMulNBits takes."""
    if (
        isinstance(block_size, bool)
        or not isinstance(block_size, (int, np.integer))
        or block_size < MIN_BLOCK
        or block_size & (block_size - 1)
    ):
        raise ValueError(
            f"block_size must be a power of 2 >= {MIN_BLOCK} (what MatMulNBits takes), got "
            f"{block_size!r}; the builder's default is 32."
        )
    return int(block_size)


def _blocks(kernel: np.ndarray, block_size: int | None) -> np.ndarray:
    """`kernel` `(K, N)` as float32 blocks `(N, K / block_size, block_size)`."""
    k, n = kernel.shape
    block_size = k if block_size is None else block_size
    if k % block_size:
        raise ValueError(f"K={k} is not a multiple of block_size={block_size}.")
    # C-ordered, as is all that is made from it (a caller may hand it to a C function)
    blocks = np.asarray(kernel, np.float32).T.reshape(n, k // block_size, block_size)
    return np.ascontiguousarray(blocks)


def _round_half_away(x: np.ndarray) -> np.ndarray:
    return np.floor(np.abs(x.astype(np.float64)) + 0.5) * np.sign(x)


def largest_magnitude(blocks: np.ndarray) -> np.ndarray:
    """Each block's (last axis) value of largest magnitude; of `m` and `-m` (frequent in
    bfloat16 weights) `-m`, as MLAS: `|max| > |min| ? max : min`."""
    high, low = blocks.max(-1), blocks.min(-1)
    return np.where(np.abs(high) > np.abs(low), high, low)


def _integers(blocks: np.ndarray, bits: int) -> tuple[np.ndarray, np.ndarray]:
    """MLAS's `(q (N, blocks, block_size) uint8, scales (N, blocks) float32)`."""
    largest = largest_magnitude(blocks)
    zero = np.float32(1 << (bits - 1))
    scales = (largest / -zero).astype(np.float32)
    with np.errstate(divide="ignore"):
        reciprocal = np.where(scales != 0, np.float32(1) / scales, np.float32(0))
    shifted = (blocks * reciprocal[..., None]).astype(np.float32) + zero  # float32, as MLAS
    q = np.clip(_round_half_away(shifted), 0, (1 << bits) - 1).astype(np.uint8)
    return q, scales


def _asymmetric_integers(blocks: np.ndarray, bits: int) -> tuple:
    """MLAS's asymmetric `(q, scales, zero points (N, blocks) uint8)` (module docstring)."""
    top = np.float32((1 << bits) - 1)
    low = np.minimum(blocks.min(-1), np.float32(0))
    high = np.maximum(blocks.max(-1), np.float32(0))
    scales = ((high - low) / top).astype(np.float32)
    nonzero = scales != 0
    with np.errstate(divide="ignore", invalid="ignore"):
        zero = np.where(nonzero, np.float32(0) - low / scales, low).astype(np.float32)
        reciprocal = np.where(nonzero, np.float32(1) / scales, np.float32(0))
    zero = np.clip(_round_half_away(zero), 0, top).astype(np.float32)
    shifted = (blocks * reciprocal[..., None]).astype(np.float32) + zero[..., None]
    q = np.clip(_round_half_away(shifted), 0, top).astype(np.uint8)
    return q, scales, zero.astype(np.uint8)


def _litert_integers(blocks: np.ndarray, bits: int) -> tuple[np.ndarray, np.ndarray]:
    """LiteRT's `(q, scales)`: positive scales, narrow range, float16 scales at 4 bits."""
    top = (1 << (bits - 1)) - 1
    scales = (np.abs(blocks).max(-1) / np.float32(top)).astype(np.float32)
    if bits == 4:
        scales = scales.astype(np.float16).astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(scales[..., None] != 0, blocks / scales[..., None], 0)
    signed = np.clip(_round_half_away(ratio), -top, top)
    return (signed + (1 << (bits - 1))).astype(np.uint8), scales


def pack(q: np.ndarray, bits: int, fill: int = 0) -> np.ndarray:
    """`q` along its last axis as MatMulNBits stores it: 4 bits two a byte, low nibble
    first, an odd count's last high nibble `fill` (MLAS fills zero points' with 8)."""
    if bits == 8:
        return q
    if bits != 4:
        raise ValueError(f"bits must be 4 or 8, got {bits!r}.")
    if q.shape[-1] % 2:
        q = np.concatenate([q, np.full((*q.shape[:-1], 1), fill, np.uint8)], axis=-1)
    return (q[..., 0::2] | (q[..., 1::2] << 4)).astype(np.uint8)


def quantize(
    kernel: np.ndarray,
    bits: int,
    block_size: int | None,
    rule: str = "mlas",
    symmetric: bool = True,
) -> Quantized:
    """`kernel` `(K, N)` round-to-nearest, blockwise along K (module docstring): `rule`
    "mlas" (MatMulNBits') or "litert" (symmetric only); `block_size` None: one block per
    column; `symmetric` False: with zero points (MLAS's asymmetric blocks)."""
    if rule not in RULES:
        raise ValueError(f"rule must be one of {RULES}, got {rule!r}.")
    if bits not in QUANTIZE_MODES.values():
        raise ValueError(f"bits must be 4 or 8, got {bits!r}.")
    blocks = _blocks(kernel, block_size)
    if not symmetric:
        if rule != "mlas":
            raise ValueError("LiteRT's blocks are symmetric (rule='litert', symmetric=False).")
        q, scales, zeros = _asymmetric_integers(blocks, bits)
        zeros = pack(zeros, bits, fill=1 << (bits - 1))
        return Quantized(pack(q, bits), scales, bits, blocks.shape[-1], zeros)
    q, scales = (_integers if rule == "mlas" else _litert_integers)(blocks, bits)
    return Quantized(pack(q, bits), scales, bits, blocks.shape[-1])


def quantize_as(kernel: np.ndarray, quantization) -> Quantized:
    """`kernel` quantized as `quantization` (a `quantized_graph.Quantization`) asks."""
    q = quantization
    return quantize(kernel, q.bits, q.block_size, q.rule, getattr(q, "symmetric", True))


def asymmetric(
    unsigned: np.ndarray, scales: np.ndarray, zeros: np.ndarray, block: int, bits: int = 4
) -> Quantized:
    """The `Quantized` of stored asymmetric blocks (`w = (q - zero) * scale`): `unsigned`
    `q` `(K, N)` and `zeros` `(blocks, N)` in `[0, 2^bits)`, `scales` `(blocks, N)`; K
    padded to whole blocks with each block's zero point (those rows weigh 0), `q` and the
    zero points packed along K as MatMulNBits reads them (4 bits: two a byte).

    Raises:
        ExportError: blocks that do not cover K, or an integer or zero point outside
            `[0, 2^bits)`.
    """
    k, n = unsigned.shape
    blocks = scales.shape[0]
    if -(-k // block) != blocks:
        raise ExportError(f"{blocks} blocks of {block} do not cover K={k}.")
    zeros = np.asarray(zeros, np.float64)
    top = (1 << bits) - 1
    if np.any(zeros != np.round(zeros)) or zeros.min() < 0 or zeros.max() > top:
        raise ExportError(f"a {bits}-bit zero point outside the integers 0..{top}; not exported.")
    if unsigned.size and unsigned.max() > top:
        raise ExportError(f"a {bits}-bit integer outside 0..{top}; not exported.")
    q = np.asarray(unsigned, np.uint8).T  # (N, K)
    zero_u = zeros.astype(np.uint8).T  # (N, blocks)
    pad = np.repeat(zero_u[:, -1:], blocks * block - k, axis=1)
    full = np.concatenate([q, pad], axis=1).reshape(n, blocks, block)
    packed, zero_points = pack(full, bits), np.ascontiguousarray(pack(zero_u, bits))
    scales = np.ascontiguousarray(np.asarray(scales, np.float32).T)
    return Quantized(packed, scales, bits, block, zero_points, k)


def nibbles(packed: np.ndarray) -> np.ndarray:
    """uint8 bytes of two 4-bit integers each, the low nibble first along the last axis."""
    return np.stack([packed & 15, packed >> 4], axis=-1).reshape(*packed.shape[:-1], -1)


def unpacked(quantized: Quantized) -> np.ndarray:
    """The integers `q` `(N, blocks, block_size)`."""
    packed = quantized.packed
    if quantized.bits == 8:
        return packed
    return nibbles(packed)


def zero_points(quantized: Quantized) -> np.ndarray:
    """The zero point of each block, `(N, blocks)` float32 (`2^(bits-1)` if none stored)."""
    n, blocks, _ = quantized.packed.shape
    if quantized.zero_points is None:
        return np.full((n, blocks), 1 << (quantized.bits - 1), np.float32)
    zeros = quantized.zero_points if quantized.bits == 8 else nibbles(quantized.zero_points)
    return zeros[:, :blocks].astype(np.float32)


def dequantize(quantized: Quantized) -> np.ndarray:
    """The float32 `(K, N)` kernel the file stores: `(q - zero) * scale`."""
    q = unpacked(quantized).astype(np.float32) - zero_points(quantized)[..., None]
    w = (q * quantized.scales[..., None]).astype(np.float32)
    k, n = quantized.shape
    return np.ascontiguousarray(w.reshape(n, -1)[:, :k].T)


def round_trip(
    kernel: np.ndarray,
    bits: int,
    block_size: int | None,
    rule: str = "mlas",
    symmetric: bool = True,
) -> np.ndarray:
    """`dequantize(quantize(kernel))`: the float32 weight a quantized file computes with."""
    return dequantize(quantize(kernel, bits, block_size, rule, symmetric))
