"""The layout of a quantized EinsumDense's kernel against the `(K, N)` matrix it computes.

keras_hub's Gemma (1-3) keeps its query, key and value kernels `(heads, width, head_dim)`
(equation `btd,ndh->btnh`): the contracted axis is not the leading one. Keras 3.15
(`keras/src/layers/core/einsum_dense.py`) quantizes such a kernel

- int8: in its own shape, `AbsMaxQuantizer(axis=kernel_reduced_axes)`: one scale per output
  channel, kept in the output's axis order, so the `(K, N)` integers are the kernel
  transposed to `kernel_axes` and the scales are as stored;
- int4 (blocks or per channel): reshaped to `(rows, columns)` in stored order, without a
  transpose, and quantized along that matrix's columns. Unless the axes before the
  contracted ones all have size 1, a scale then covers entries of several output channels
  and changes along K within one channel, which no MatMulNBits block holds
  (`refuse_int4_out_of_order` says how, for the layer at hand).
"""

from __future__ import annotations

import numpy as np

from keras_posenc.backend.keras_private import quantized_part
from keras_posenc.export.errors import ExportError


def kernel_axes(layer) -> list[int] | None:
    """The kernel axes of a quantized EinsumDense, contracted ones first, then the others in
    the order the output has them (its `equation`'s): the `(K, N)` the file computes with
    is the kernel transposed to them. None for a Dense."""
    reduced = quantized_part(layer, "kernel_reduced_axes")
    if reduced is None:
        return None
    inputs, output = layer.equation.split("->")
    kernel_spec = inputs.split(",")[-1]
    kept = [axis for axis in range(len(layer.kernel.shape)) if axis not in reduced]
    if "." not in kernel_spec + output:
        kept.sort(key=lambda axis: output.index(kernel_spec[axis]))
    return [int(axis) for axis in reduced] + kept


def contracted_not_leading(layer) -> bool:
    """Whether the `(K, N)` of a quantized EinsumDense is its kernel transposed."""
    axes = kernel_axes(layer)
    return axes is not None and axes != sorted(axes)


def _shortest_run(values: np.ndarray) -> int:
    """The length of the shortest run of equal neighbours in `values`."""
    ends = np.concatenate([np.flatnonzero(np.diff(values) != 0), [values.size - 1]])
    return int(np.diff(ends, prepend=-1).min())


def refuse_int4_out_of_order(layer, block: int | None, owner: str) -> None:
    """Refuses an int4 EinsumDense (`block`: its block size, None per channel) that Keras
    flattened without its contracted axes first.

    Keras 3.15 reshapes the kernel to `(rows, columns)` in its stored order (no transpose)
    and quantizes that matrix's columns; unless the kernel's stored order already has its
    contracted axes first (axes of size 1 aside), the blocks are not those of the `(K, N)`
    matrix the layer computes with."""
    axes = kernel_axes(layer)
    if axes is None:
        return
    shape = tuple(layer.kernel.shape)
    moved = [axis for axis in axes if shape[axis] != 1]
    if moved == sorted(moved):
        return
    reduced = len(quantized_part(layer, "kernel_reduced_axes"))
    k = int(np.prod([shape[axis] for axis in axes[:reduced]]))
    columns = int(np.prod(shape)) // k
    order = np.arange(int(np.prod(shape))).reshape(shape).transpose(axes).reshape(k, -1)
    block = block or k
    scale_of = order % columns + columns * (order // columns // block)
    run = min(_shortest_run(column) for column in scale_of.T)
    changes = "from one row to the next" if run == 1 else f"every {run} rows"
    pairs = np.unique(scale_of * k * columns + np.arange(columns))  # (scale, output channel)
    channels = np.bincount(pairs // (k * columns)).max()
    raise ExportError(
        f"{owner}: Keras quantized the EinsumDense {layer.name!r} ({layer.equation!r}, "
        f"kernel {shape}) as int4 by reshaping its kernel to ({k}, {columns}) in stored "
        f"order, which does not put its contracted axes {axes[:reduced]} first: an int4 "
        f"scale covers entries of up to {channels} output channels, and along the "
        f"contracted axis an output channel's scale changes {changes}, which no "
        "MatMulNBits block (contiguous rows of one output channel, >= 16) holds exactly; "
        "not re-quantized. "
        'Quantize with "int8" (exported as stored), or export the float model with '
        'save_decoder(..., quantize="int4").'
    )
