"""Quantized weights in a decoder's LiteRT file: `FULLY_CONNECTED` over int8 or int4 weights.

The decoder is converted in float32 (`litert_decoder.py`, `litertlm_model.py`: every
projection is a `FULLY_CONNECTED` whose weight is the description's kernel transposed,
`(N, K)`), and each weight that `quantized_graph.quantized_kernels` lists is then written
in the flatbuffer as `quantize.py` stores it with LiteRT's rule (`rule="litert"`):

- int8: an INT8 tensor, one positive scale per output channel (`quantized_dimension` 0,
  zero points 0). LiteRT runs it as a dynamic-range ("hybrid") `FULLY_CONNECTED`: each
  row of the input rounded to int8 at run time.
- int4: an INT4 tensor (two per byte, the lower K index in the low nibble, signed) with
  `BlockwiseQuantization` over a float16 scale tensor `(N, K / block_size)`; LiteRT's
  kernel takes blocks that are multiples of 32 and rounds each input row to int8 too.

Not through the converter's own dynamic-range quantization: it folds each RMSNorm's scale
into the next weight before quantizing (`diag(scale) @ W`, which no Keras variable holds),
so its integers are not `quantize.py`'s. Built-in ops only; the graph is unchanged.

`float_arithmetic_litert` is the same file with each quantized weight as the float32 its
bytes dequantize to (read back from the file): what the verification judges to float32
tolerance, so a wrong scale or nibble cannot hide in the int8-activation bound.
"""

from __future__ import annotations

import flatbuffers
import numpy as np
from tensorflow.lite.python import schema_py_generated as schema

from keras_posenc.export.decoder.quantize import Quantized, dequantize, quantize, unpacked
from keras_posenc.export.errors import ExportError

_IDENTIFIER = b"TFL3"


def _weights_of_fully_connected(model) -> list:
    """`[(subgraph, weight tensor index)]` of every `FULLY_CONNECTED` of `model`. A weight
    tensor that another op reads too (a tied table's `GATHER`) is given to the
    `FULLY_CONNECTED` as a tensor of its own, over the same buffer, so that quantizing it
    leaves the other reader's float32 tensor as it was."""
    found = []
    for subgraph in model.subgraphs:
        readers = {}
        for op in subgraph.operators:
            for index in op.inputs:
                readers[int(index)] = readers.get(int(index), 0) + 1
        for op in subgraph.operators:
            code = model.operatorCodes[op.opcodeIndex]
            if max(code.builtinCode, code.deprecatedBuiltinCode) != (
                schema.BuiltinOperator.FULLY_CONNECTED
            ):
                continue
            index = int(op.inputs[1])
            if readers[index] > 1:
                shared = subgraph.tensors[index]
                own = schema.TensorT()
                own.shape, own.type, own.buffer = shared.shape, shared.type, shared.buffer
                own.name = shared.name + b"_weight"
                subgraph.tensors.append(own)
                index = len(subgraph.tensors) - 1
                op.inputs[1] = index
            found.append((subgraph, index))
    return found


def _serialized(model, replaced) -> bytes:
    """`model`'s bytes, the data of the `replaced` buffers that no tensor reads dropped."""
    used = {t.buffer for subgraph in model.subgraphs for t in subgraph.tensors}
    for index in set(replaced) - used:
        model.buffers[index].data = None
    builder = flatbuffers.Builder(1024)
    builder.Finish(model.Pack(builder), file_identifier=_IDENTIFIER)
    return bytes(builder.Output())


def _new_buffer(model, data: np.ndarray) -> int:
    buffer = schema.BufferT()
    buffer.data = np.frombuffer(np.ascontiguousarray(data).tobytes(), np.uint8)
    model.buffers.append(buffer)
    return len(model.buffers) - 1


def _signed_rows(stored: Quantized) -> np.ndarray:
    """`q - zero` as int8 `(N, K)`."""
    n = stored.packed.shape[0]
    return (unpacked(stored).astype(np.int16) - (1 << (stored.bits - 1))).reshape(n, -1)


def _int4_bytes(signed: np.ndarray) -> np.ndarray:
    """LiteRT's INT4 `(N, K)` (K even): two's-complement nibbles, even K index low."""
    nibbles = (signed & 15).astype(np.uint8)
    return nibbles[:, 0::2] | (nibbles[:, 1::2] << 4)


def _quantize_tensor(model, subgraph, tensor, stored: Quantized, written: dict) -> None:
    """Makes `tensor` (an `(N, K)` float32 weight) `stored`; `written` caches the new
    buffer and scale buffer per stored weight (signatures share their weights)."""
    key = id(stored)
    if key not in written:
        signed = _signed_rows(stored)
        data = signed.astype(np.int8) if stored.bits == 8 else _int4_bytes(signed)
        scales = None
        if stored.bits == 4:
            scales = _new_buffer(model, stored.scales.astype(np.float16))
        written[key] = (_new_buffer(model, data), scales)
    buffer, scales = written[key]
    tensor.buffer = buffer
    parameters = schema.QuantizationParametersT()
    n = stored.packed.shape[0]
    if stored.bits == 8:
        tensor.type = schema.TensorType.INT8
        parameters.scale = [float(s) for s in stored.scales[:, 0]]
        parameters.zeroPoint = [0] * n
        parameters.quantizedDimension = 0
    else:
        tensor.type = schema.TensorType.INT4
        scale_tensor = schema.TensorT()
        scale_tensor.shape = list(stored.scales.shape)
        scale_tensor.type = schema.TensorType.FLOAT16
        scale_tensor.buffer = scales
        scale_tensor.name = tensor.name + b"_scales"
        subgraph.tensors.append(scale_tensor)
        details = schema.BlockwiseQuantizationT()
        details.scales = len(subgraph.tensors) - 1
        details.zeroPoints = -1
        details.blockSize = stored.block_size
        parameters.detailsType = schema.QuantizationDetails.BlockwiseQuantization
        parameters.details = details
    tensor.quantization = parameters


def _dequantize_other_uses(model, by_buffer: dict) -> None:
    """A float32 tensor still reading a quantized weight's buffer (a tied embedding's
    `GATHER` table) reads its dequantized values instead: the reference's weights."""
    made = {}
    for subgraph in model.subgraphs:
        for tensor in subgraph.tensors:
            stored = by_buffer.get(tensor.buffer)
            if stored is None or tensor.type != schema.TensorType.FLOAT32:
                continue
            if tensor.buffer not in made:
                made[tensor.buffer] = _new_buffer(model, np.ascontiguousarray(dequantize(stored).T))
            tensor.buffer = made[tensor.buffer]


def quantized_litert(tflite: bytes, named_kernels: list, quantization) -> bytes:
    """`tflite` (a float32 file) with the `FULLY_CONNECTED` weight of each kernel `(K, N)`
    of `named_kernels` (`[(name, kernel)]`: a decoder's `quantized_kernels`) stored as
    `quantize(kernel, bits, block_size, rule="litert")` (module docstring), `quantization`
    a `quantized_graph.Quantization`.

    Raises:
        ExportError: a kernel is no `FULLY_CONNECTED` weight of the file.
    """
    bits, block_size = quantization.bits, quantization.block_size
    model = schema.ModelT.InitFromPackedBuf(bytearray(tflite), 0)
    kernels, names = {}, {}  # (N, K) float32 bytes -> the kernel's Quantized, made once
    for name, kernel in named_kernels:
        key = np.ascontiguousarray(kernel.T, np.float32).tobytes()
        if key not in kernels:
            kernels[key] = quantize(kernel, bits, block_size, rule="litert")
            names[id(kernels[key])] = name
    by_buffer, written = {}, {}
    for subgraph, index in _weights_of_fully_connected(model):
        tensor = subgraph.tensors[index]
        if tensor.type != schema.TensorType.FLOAT32:
            continue
        if tensor.buffer not in by_buffer:  # read before any buffer is replaced
            data = model.buffers[tensor.buffer].data
            content = b"" if data is None else np.asarray(data, np.uint8).tobytes()
            by_buffer[tensor.buffer] = kernels.get(content)
        stored = by_buffer[tensor.buffer]
        if stored is not None:
            _quantize_tensor(model, subgraph, tensor, stored, written)
    _dequantize_other_uses(model, by_buffer)
    missing = [names[id(stored)] for stored in kernels.values() if id(stored) not in written]
    if missing:  # the reference would dequantize a weight the file keeps in float32
        raise ExportError(
            f"The LiteRT file has no FULLY_CONNECTED over {', '.join(missing)} (the "
            "converter changed the weight): it cannot be stored quantized."
        )
    return _serialized(model, [b for b, stored in by_buffer.items() if stored is not None])


def _dequantized(model, subgraph, tensor) -> np.ndarray:
    """The float32 `(N, K)` that `tensor`'s bytes and quantization parameters say."""
    n, k = tensor.shape
    raw = np.asarray(model.buffers[tensor.buffer].data, np.uint8)
    parameters = tensor.quantization
    if tensor.type == schema.TensorType.INT8:
        scales = np.asarray(parameters.scale, np.float32)[:, None]
        return raw.view(np.int8).reshape(n, k).astype(np.float32) * scales
    nibbles = np.stack([raw & 15, raw >> 4], -1).reshape(n, -1)[:, :k].astype(np.int8)
    signed = np.where(nibbles > 7, nibbles - 16, nibbles).astype(np.float32)
    details = parameters.details
    scale_tensor = subgraph.tensors[details.scales]
    scales = np.asarray(model.buffers[scale_tensor.buffer].data, np.uint8).view(np.float16)
    scales = scales.astype(np.float32).reshape(n, k // details.blockSize)
    return signed * np.repeat(scales, details.blockSize, axis=1)


def float_arithmetic_litert(tflite: bytes) -> bytes:
    """`tflite` with each int8 / int4 `FULLY_CONNECTED` weight as the float32 its bytes
    dequantize to: the same weights, computed in float (module docstring)."""
    model = schema.ModelT.InitFromPackedBuf(bytearray(tflite), 0)
    made = {}  # quantized buffer -> its float32 buffer
    for subgraph, index in _weights_of_fully_connected(model):
        tensor = subgraph.tensors[index]
        if tensor.type not in (schema.TensorType.INT8, schema.TensorType.INT4):
            continue
        if tensor.buffer not in made:
            weights = _dequantized(model, subgraph, tensor).astype(np.float32)
            made[tensor.buffer] = _new_buffer(model, weights)
        tensor.buffer = made[tensor.buffer]
        tensor.type = schema.TensorType.FLOAT32
        tensor.quantization = None
    return _serialized(model, made)
