"""An untied embedding as int4 `com.microsoft.GatherBlockQuantized` (`quantize_embedding=True`).

The genai builder keeps an untied embedding float32 unless it is asked for more
(`--extra_options op_types_to_quantize=MatMul/Gather`); then onnxruntime's
`MatMulNBitsQuantizer` writes the table `(vocabulary, width)` as an `INT4` tensor of the
same shape (two a byte, the lower index in the low nibble, in row-major order) and float32
`scales` `(vocabulary, width / block_size)`, read by `GatherBlockQuantized` (`gather_axis`
0, `quantize_axis` 1, `block_size`). Its rule (`DefaultWeightOnlyQuantizer.quantize_ndarray`,
symmetric) is not MatMulNBits' (`quantize.py`): per block of `block_size` along the width,
`scale = m / -8` with `m` the value of largest magnitude (of `m` and `-m`, `-m`), and
`q = clip(round_half_even(w / scale), -8, 7)` (a float32 division), `w = q * scale`.
Written here bit for bit, so that the bytes are the builder's.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from onnx import TensorProto

from keras_posenc.export.decoder.graph_builder import MICROSOFT, GraphBuilder
from keras_posenc.export.decoder.quantize import largest_magnitude, pack
from keras_posenc.export.errors import ExportError


def gather_quantize(table: np.ndarray, block_size: int) -> tuple[np.ndarray, np.ndarray]:
    """`(q int8 (V, D) in [-8, 7], scales float32 (V, D / block_size))` of `table` (module
    docstring); D a multiple of `block_size`."""
    v, d = table.shape
    blocks = np.asarray(table, np.float32).reshape(v, d // block_size, block_size)
    scales = (largest_magnitude(blocks) / np.float32(-8.0)).astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(scales[..., None] == 0, 0, blocks / scales[..., None])
    q = np.clip(np.round(ratio), -8, 7).astype(np.int8)
    return q.reshape(v, d), scales


def gather_round_trip(table: np.ndarray, block_size: int) -> np.ndarray:
    """The float32 table the file's `GatherBlockQuantized` reads: `q * scale`."""
    q, scales = gather_quantize(table, block_size)
    v, d = q.shape
    w = q.reshape(v, -1, block_size).astype(np.float32) * scales[..., None]
    return w.astype(np.float32).reshape(v, d)


def int4_bytes(q: np.ndarray) -> np.ndarray:
    """ONNX `INT4` raw data of `q` (int8 in [-8, 7]): two a byte, the first in the low nibble."""
    return pack(q.reshape(-1).astype(np.uint8) & 15, 4)


def quantized_lookup(g: GraphBuilder, table: np.ndarray, ids: str) -> str:
    """The embedded tokens: `GatherBlockQuantized` over `table` quantized (module docstring)."""
    block = g.quantization.block_size
    q, scales = gather_quantize(table, block)
    data = g.initializer(
        "embed_tokens.weight_Q4", int4_bytes(q), data_type=TensorProto.INT4, dims=q.shape
    )
    return g.node(
        "GatherBlockQuantized",
        [data, ids, g.initializer("embed_tokens.weight_scales", scales)],
        domain=MICROSOFT,
        block_size=block,
        gather_axis=0,
        quantize_axis=1,
    )


def embedding_quantization(quantization, quantize_embedding, attention: str):
    """`quantization` with `embedding` set where `quantize_embedding` asks for it.

    Raises:
        TypeError: `quantize_embedding` is not a bool.
        ExportError: asked for without `quantize="int4"`, with asymmetric blocks, with
            standard attention or in a LiteRT file (the builder's GatherBlockQuantized is
            ONNX's, int4 only; its asymmetric table is not written).
    """
    if not isinstance(quantize_embedding, bool):
        raise TypeError(f"quantize_embedding must be a bool, got {quantize_embedding!r}.")
    if not quantize_embedding:
        return quantization
    if quantization is None or quantization.bits != 4 or quantization.rule != "mlas":
        raise ExportError(
            "quantize_embedding=True needs quantize='int4' and an ONNX file only: the "
            "untied embedding is written as int4 GatherBlockQuantized (the genai builder's "
            "op_types_to_quantize=MatMul/Gather), which takes 4 bits."
        )
    if not getattr(quantization, "symmetric", True):
        raise ExportError(
            "quantize_embedding=True is written symmetric only (the builder's INT4 table); "
            "use symmetric=True, or quantize_embedding=False."
        )
    if attention != "gqa":
        raise ExportError(
            "quantize_embedding=True is written with attention='gqa' only (GatherBlockQuantized "
            "is a com.microsoft op); use attention='gqa', or quantize_embedding=False."
        )
    return dataclasses.replace(quantization, embedding=True)
