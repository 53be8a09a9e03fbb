"""A decoder's weights streamed to `model.onnx.data` as its graph is written (external data).

A protobuf holds at most 2 GB, so a float32 decoder above ~500M parameters cannot be one
`model.onnx`. Past `EXTERNAL_DATA_LIMIT` (or when asked), `save_decoder` writes the graph
to `model.onnx` and every initializer of `MIN_EXTERNAL_BYTES` or more to `model.onnx.data`
(onnx's external-data format, the file name onnxruntime-genai's model builder uses). The
bytes go to the file as each initializer is made (`streaming`): the `ModelProto` holds
only the references (`location`, `offset`, `length`; the location relative to the model,
so the folder can be moved), never a second copy of the weights, and no serialized copy
of the whole model is made. Each tensor starts at a multiple of `ALIGNMENT` bytes, so
that onnxruntime can map it from the file rather than read it into memory it allocates.

Below the limit the weights stream the same way into `model.onnx` itself (`WeightsFile`'s
inline form), so that a one-file export never holds the weights twice either.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import errno
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto

from keras_posenc.export.errors import ExportError

DATA_NAME = "model.onnx.data"
# Protobuf's limit on one serialized message (2 GiB); the graph itself adds a little.
EXTERNAL_DATA_LIMIT = 2**31 - 2**24
MIN_EXTERNAL_BYTES = 1024  # smaller ones (shapes, scalars) stay in the graph, as onnx does
# Below the limit, tensors of this size or more are streamed into model.onnx itself; smaller
# ones (RoPE tables of short caches, norms) stay in the ModelProto, as they always did.
INLINE_BYTES = 2**20
CHUNK_BYTES = 2**26  # a view's bytes are copied this much at a time
ALIGNMENT = 65536  # the allocation granularity mmap needs on every platform (Windows: 64 KiB)
# What a flatbuffer (LiteRT's `.tflite`) can address.
LITERT_LIMIT = 2**31

_SINK: contextvars.ContextVar[WeightsFile | None] = contextvars.ContextVar(
    "keras_posenc_weights_file", default=None
)


def _root(array: np.ndarray) -> np.ndarray:
    """The array whose buffer `array` views (itself when it owns its data)."""
    while isinstance(array.base, np.ndarray):
        array = array.base
    return array


def weight_bytes(description) -> int:
    """The bytes of the arrays a `Decoder` holds, each buffer once (a tied head, a view of
    the embedding, counts once): what its files hold, to within the graph and padding."""
    seen, total = set(), 0

    def visit(value) -> None:
        nonlocal total
        if isinstance(value, np.ndarray):
            root = _root(value)
            if id(root) not in seen:
                seen.add(id(root))
                total += root.nbytes
        elif dataclasses.is_dataclass(value) and not isinstance(value, type):
            for field in dataclasses.fields(value):
                visit(getattr(value, field.name))
        elif isinstance(value, (tuple, list)):
            for item in value:
                visit(item)

    visit(description)
    return total


def use_external_data(size: int, external_data: bool | None) -> bool:
    """Whether weights of `size` bytes go to `model.onnx.data` (`None`: past the limit)."""
    if external_data not in (None, True, False):
        raise ValueError(f"external_data must be None, True or False, got {external_data!r}.")
    return size > EXTERNAL_DATA_LIMIT if external_data is None else external_data


def check_room(folder: str | os.PathLike, size: int) -> None:
    """Refuses, before anything is written, a disk without room for `size` bytes next to
    `folder` (where its staging folder goes)."""
    parent = Path(folder).absolute().parent
    if not parent.is_dir():
        return  # whole_or_nothing names the missing folder
    free = shutil.disk_usage(parent).free
    if free < size:
        raise ExportError(
            f"The decoder's files need about {size:,} bytes and the disk holding "
            f"{str(parent)!r} has {free:,} free; free {size - free:,} bytes or choose a "
            "folder on another disk. Nothing was written."
        )


def refuse_large_litert(size: int) -> None:
    """LiteRT's flatbuffer addresses 2 GB: refused before the converter runs."""
    if size >= LITERT_LIMIT:
        raise ExportError(
            f"The decoder's weights take {size:,} bytes, and a LiteRT file (a flatbuffer) "
            f"holds at most {LITERT_LIMIT:,}; export it with formats=('onnx',) (model.onnx "
            "with its weights in model.onnx.data), or quantize it first."
        )


@dataclasses.dataclass(frozen=True)
class Plan:
    """How `model.onnx` is written: `size` bytes of weights, in `model.onnx.data` or not."""

    size: int
    external: bool


def plan_weights(
    description, folder: str | os.PathLike, formats: tuple[str, ...], external_data
) -> Plan:
    """Where the weights go; refuses LiteRT past its limit and a disk without room for
    the files, before any file is written."""
    size = weight_bytes(description)
    if "litert" in formats:
        refuse_large_litert(size)
    check_room(folder, size * len(formats))
    return Plan(size, use_external_data(size, external_data))


def _key(field: int) -> bytes:
    return _varint(field << 3 | 2)  # a length-delimited field


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        low, value = value & 0x7F, value >> 7
        out.append(low | (0x80 if value else 0))
        if not value:
            return bytes(out)


# Field numbers of onnx.proto: ModelProto.graph, GraphProto.initializer, TensorProto.raw_data.
_GRAPH, _INITIALIZER, _RAW_DATA = 7, 5, 9


class WeightsFile:
    """The file the weights stream to: `tensor(name, array)` writes `array`'s bytes and
    returns a `TensorProto` without them (its `external_data` says where they are).

    External (`model.onnx.data`): the bytes at the next multiple of `ALIGNMENT`, and the
    tensor refers to them. Inline (`model.onnx` itself, below the limit): each tensor of
    `INLINE_BYTES` or more is written as a ModelProto holding a graph that holds that one
    initializer, and `finish(model)` appends the model without them. Protobuf merges the
    repeated occurrences of an embedded message (`graph`) and appends repeated fields
    (`initializer`), so the file parses as one model holding every initializer, written
    without ever holding the weights as protobuf bytes.
    """

    def __init__(self, path: str | os.PathLike, expected: int | None = None, inline=False):
        self.path = Path(path)
        self.expected = expected  # for the error that names the bytes needed
        self.inline = inline
        self._file = open(self.path, "wb")  # noqa: SIM115 (closed by `close`)
        self.size = 0
        self._streamed: set[str] = set()

    def takes(self, array: np.ndarray) -> bool:
        """Whether `array` goes to the file (smaller ones stay in the graph)."""
        return array.nbytes >= (INLINE_BYTES if self.inline else MIN_EXTERNAL_BYTES)

    def tensor(self, name: str, array: np.ndarray, data_type=None, dims=None) -> TensorProto:
        """`data_type` and `dims` given: `array` is the tensor's raw bytes (int4: two a byte)."""
        if array.dtype.byteorder == ">":  # ONNX's raw data is little-endian
            array = array.astype(array.dtype.newbyteorder("<"))
        tensor = TensorProto()
        tensor.name = name
        tensor.dims.extend(array.shape if dims is None else dims)
        if data_type is None:
            data_type = onnx.helper.np_dtype_to_tensor_dtype(array.dtype)
        tensor.data_type = data_type
        if self.inline:
            header = tensor.SerializeToString()
            raw = _key(_RAW_DATA) + _varint(array.nbytes)
            length = len(header) + len(raw) + array.nbytes
            initializer = _key(_INITIALIZER) + _varint(length)
            self._write(_key(_GRAPH) + _varint(len(initializer) + length) + initializer)
            self._write(header + raw)
            offset = self.size
        else:
            offset = -self.size % ALIGNMENT + self.size
            self._write(b"\0" * (offset - self.size))
        self._write_array(array)
        self._streamed.add(name)
        tensor.data_location = TensorProto.EXTERNAL
        for key, value in (("location", self.path.name), ("offset", offset)):
            entry = tensor.external_data.add()
            entry.key, entry.value = key, str(value)
        entry = tensor.external_data.add()
        entry.key, entry.value = "length", str(array.nbytes)
        return tensor

    def finish(self, model: onnx.ModelProto) -> None:
        """Inline: appends `model` without the initializers already in the file."""
        kept = [t for t in model.graph.initializer if t.name not in self._streamed]
        del model.graph.initializer[:]
        model.graph.initializer.extend(kept)
        self._write(model.SerializeToString())

    def _write_array(self, array: np.ndarray) -> None:
        if array.flags.c_contiguous:
            self._write(memoryview(array.reshape(-1)).cast("B"))
            return
        # A view (a tied head's transpose): copied a block of rows at a time.
        rows = max(1, CHUNK_BYTES // max(1, array[:1].nbytes))
        for start in range(0, len(array), rows):
            block = np.ascontiguousarray(array[start : start + rows])
            self._write(memoryview(block.reshape(-1)).cast("B"))

    def _write(self, data) -> None:
        try:
            self._file.write(data)
            self.size += len(data)
        except OSError as error:
            if error.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            needed = f"about {self.expected:,} bytes" if self.expected else "more room"
            raise OSError(
                error.errno,
                f"The disk ran out of room writing {self.path.name} ({needed} needed, "
                f"{self.size:,} written); free some or choose a folder on another disk. "
                "Nothing was kept.",
                str(self.path),
            ) from error

    def close(self) -> None:
        self._file.close()


@contextlib.contextmanager
def streaming(
    path: str | os.PathLike, expected: int | None = None, inline: bool = False
) -> Iterator[WeightsFile]:
    """While open, `GraphBuilder.initializer` writes the arrays the file `takes` to it
    (see `WeightsFile`)."""
    weights = WeightsFile(path, expected, inline)
    token = _SINK.set(weights)
    try:
        yield weights
    finally:
        _SINK.reset(token)
        weights.close()


def write_onnx(emit, path: Path, plan: Plan | None = None) -> None:
    """Writes the model `emit()` makes (as it makes it) to `path`, its weights in
    `path.name + ".data"` next to it where `plan.external`. `emit` may also be a
    ModelProto (then written as it is)."""
    external = plan is not None and plan.external
    target = path.with_name(path.name + ".data") if external else path
    with streaming(target, plan and plan.size, inline=not external) as weights:
        model = emit() if callable(emit) else emit
        if not external:
            weights.finish(model)
    if external:
        with open(path, "wb") as file:
            file.write(model.SerializeToString())


def session_options():
    """onnxruntime's options for a session of a file written here."""
    import onnxruntime

    return onnxruntime.SessionOptions()


def current() -> WeightsFile | None:
    """The weights file initializers stream to now, or None (they stay in the graph)."""
    return _SINK.get()
