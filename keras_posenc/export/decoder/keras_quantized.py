"""Layers Keras quantized (`model.quantize("int8" | "int4")`), read as they are stored.

Keras 3.15 stores (never re-quantized here, only repacked):

- **int8** (Dense, EinsumDense, the ReversibleEmbedding's head): the kernel as int8 `q`
  with one float32 `scale` per output channel, `w = q / scale`; at run time each row of
  the input is rounded to int8 (`AbsMaxQuantizer`: `s = 127 / (max|x| + 1e-7)`,
  `round_half_even(x * s)` clipped to `±127`) and the layer computes
  `(x_q @ q) / (scale * s)`. Read as `KerasInt8`.
- **int4** with blocks (the default, `block_size` 128): `q` in `[-8, 7]` packed two per
  byte along the *output* axis, one float32 scale and int8 zero point per block of
  `block_size` inputs and output channel, `w = (q - zero) * scale` computed in float32,
  inputs not quantized. Read as `quantize.Quantized` with `zero_points` (MatMulNBits'
  layout: `q + 8` and `zero + 8` unsigned, packed along K).
- **Embedding** int8: `q` `(vocabulary, width)` int8, one scale per token, `q / scale`;
  int4 with blocks: blocks along the width, as the int4 kernels (a tied head is the same
  `Quantized`, K the width and N the vocabulary).

- **int4 per channel** (`block_size=None`/`-1`): `q` in `[-8, 7]` packed along the output
  axis, one scale per output channel, `w = q / scale`, inputs rounded as int8's where the
  layer has an input quantizer: read as a `KerasInt8` of `bits` 4 (a byte a value).

- **gptq** / **awq** (Dense, EinsumDense): `keras_gptq.py` (`KerasGrouped`).

An int8 / int4 EinsumDense whose contracted kernel axes are not leading (Gemma's q/k/v) is
read through `einsum_layout`: int8 as stored, int4 refused where its blocks are not the
`(K, N)`'s; a gptq / awq one is refused (`_leading_reduced`).

float8, and a model mixing modes are refused by name (`refuse_unexportable`).
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses

import keras
import numpy as np

from keras_posenc.backend.keras_private import quantized_part
from keras_posenc.export.decoder.einsum_layout import (
    contracted_not_leading,
    kernel_axes,
    refuse_int4_out_of_order,
)
from keras_posenc.export.decoder.keras_gptq import (
    GROUPED_MODES,
    block_order,
    float_kernel_shape,
    read_grouped,
    uncalibrated,
)
from keras_posenc.export.decoder.quantize import Quantized, asymmetric, nibbles
from keras_posenc.export.decoder.weight_arrays import weight_array
from keras_posenc.export.errors import ExportError

SUPPORTED = (
    "int8",
    "int4 (blocks, Keras's default, or per channel)",
    "gptq and awq (Dense, EinsumDense; groups a power of 2 >= 16, g_idx whole groups)",
)
_READABLE = ("Dense", "EinsumDense", "Embedding", "ReversibleEmbedding")


@dataclasses.dataclass(frozen=True)
class KerasInt8:
    """A Keras int8 `(K, N)` kernel: `integers` int8 `(K, N)`, `scales` float32 `(N,)`
    (`w = integers / scales`); `activation` None (float inputs) or `(low, high, epsilon)`
    of the per-row `AbsMaxQuantizer` Keras rounds the inputs with."""

    integers: np.ndarray
    scales: np.ndarray
    activation: tuple[int, int, float] | None
    bits: int = 8  # 4: Keras's int4 per channel (integers in [-8, 7], stored a byte each)

    @property
    def shape(self) -> tuple[int, int]:
        return self.integers.shape


def _value(variable) -> np.ndarray:
    return np.asarray(keras.ops.convert_to_numpy(variable))


def _activation(layer, owner: str):
    """The `(low, high, epsilon)` of the layer's input quantizer, or None."""
    quantizer = getattr(layer, "inputs_quantizer", None)
    if quantizer is None:
        return None
    if type(quantizer).__name__ != "AbsMaxQuantizer" or quantizer.axis not in (None, (-1,)):
        raise ExportError(
            f"{owner}: {layer.name!r} quantizes its inputs with {quantizer!r}; the export "
            "writes Keras's default AbsMaxQuantizer over each row."
        )
    low, high = quantizer.value_range
    return int(low), int(high), float(quantizer.epsilon)


def _leading_reduced(layer, owner: str) -> None:
    """An EinsumDense whose contracted kernel axes are not its leading ones is refused."""
    axes = quantized_part(layer, "kernel_reduced_axes")
    if axes is not None and list(axes) != list(range(len(axes))):
        raise ExportError(
            f"{owner}: the quantized EinsumDense {layer.name!r} contracts kernel axes {axes}, "
            "not its leading ones; not exported."
        )


def _asymmetric(q: np.ndarray, scales, zeros, block: int) -> Quantized:
    """`Quantized` of signed int4 `q` `(K, N)`, `scales`/`zeros` `(blocks, N)` (Keras's
    `(q - zero) * scale`): unsigned `q + 8`, `zero + 8` (`quantize.asymmetric`)."""
    zeros = np.asarray(zeros, np.float64)
    if np.any(zeros != np.round(zeros)) or zeros.min() < -8 or zeros.max() > 7:
        raise ExportError("an int4 zero point outside the integers -8..7; not exported.")
    unsigned = (q.astype(np.int16) + 8).astype(np.uint8)
    return asymmetric(unsigned, scales, (zeros + 8).astype(np.uint8), block)


def keras_dequantized(stored) -> np.ndarray:
    """The float32 `(K, N)` weight Keras computes with (`q / scale`; `(q - zero) * scale`)."""
    if isinstance(stored, KerasInt8):
        return (stored.integers.astype(np.float32) / stored.scales).astype(np.float32)
    q = nibbles(stored.packed).astype(np.float32)
    zeros = nibbles(stored.zero_points)[:, : stored.scales.shape[1]].astype(np.float32)
    w = (q.reshape(*stored.packed.shape[:2], -1) - zeros[..., None]) * stored.scales[..., None]
    k, n = stored.shape
    return np.ascontiguousarray(w.astype(np.float32).reshape(n, -1)[:, :k].T)


def _unpack_signed(packed: np.ndarray, length: int, axis: int) -> np.ndarray:
    """Keras's `unpack_int4`: int8 bytes, the low nibble first along `axis`, to `[-8, 7]`."""
    moved = np.moveaxis(packed.astype(np.uint8), axis, -1)
    values = nibbles(moved)[..., :length].astype(np.int8)
    return np.moveaxis(np.where(values > 7, values - 16, values).astype(np.int8), -1, axis)


def _block(layer) -> int | None:
    """An int4 layer's block size, or None: int4 per channel."""
    block = quantized_part(layer, "int4_block_size")
    return None if block is None or block <= 0 else int(block)


def _check_groups(layer, length: int, block: int, owner: str) -> None:
    g_idx = _value(layer.g_idx)
    if g_idx.shape != (length,) or block_order(g_idx, block, layer.name) is not None:
        raise ExportError(f"{owner}: {layer.name!r}'s g_idx is not its blocks in order.")


def read_kernel(layer, owner: str):
    """`(stored, float (K, N))` of a quantized Dense / EinsumDense, K its contracted axes."""
    mode = layer.quantization_mode
    if mode in GROUPED_MODES:
        _leading_reduced(layer, owner)
        return read_grouped(layer, owner)
    if mode == "int8" and contracted_not_leading(layer):
        # Keras keeps one scale per output channel, in the output's axis order.
        scales = _value(layer.kernel_scale).reshape(-1).astype(np.float32)
        q = _value(quantized_part(layer, "kernel")).transpose(kernel_axes(layer))
        integers = q.reshape(-1, scales.size).astype(np.int8)
        stored = KerasInt8(integers, scales, _activation(layer, owner))
    elif mode == "int8":
        q = _value(quantized_part(layer, "kernel"))
        scales = _value(layer.kernel_scale).reshape(-1).astype(np.float32)
        n = scales.size
        stored = KerasInt8(q.reshape(-1, n).astype(np.int8), scales, _activation(layer, owner))
    elif mode == "int4" and _block(layer) is None:
        refuse_int4_out_of_order(layer, None, owner)
        scales = _value(layer.kernel_scale).reshape(-1).astype(np.float32)
        q = _unpack_signed(_value(quantized_part(layer, "kernel")), scales.size, axis=-1)
        stored = KerasInt8(q, scales, _activation(layer, owner), bits=4)
    elif mode == "int4":
        refuse_int4_out_of_order(layer, _block(layer), owner)
        block = _block(layer)
        scales = _value(layer.kernel_scale)
        n = scales.shape[-1]
        q = _unpack_signed(_value(quantized_part(layer, "kernel")), n, axis=-1)
        if getattr(layer, "inputs_quantizer", None) is not None:
            raise ExportError(f"{owner}: {layer.name!r} is int4 with quantized inputs.")
        _check_groups(layer, q.shape[0], block, owner)
        stored = _asymmetric(q, scales, _value(layer.kernel_zero), block)
    else:
        raise _refused(layer, mode, owner)
    return stored, keras_dequantized(stored)


def read_embedding(embedding, owner: str):
    """`(table stored, head stored or None (tied), float table, float head)` of a quantized
    (Reversible)Embedding; the head is that of `reverse=True`."""
    mode = embedding.quantization_mode
    tied = getattr(embedding, "tie_weights", True)
    integers = _value(quantized_part(embedding, "embeddings"))
    if mode == "int8":
        scales = _value(embedding.embeddings_scale).astype(np.float32)
        table = KerasInt8(integers.T.astype(np.int8), scales, _activation(embedding, owner))
        head = None
        if not tied:
            head = KerasInt8(
                _value(embedding.reverse_embeddings).astype(np.int8),
                _value(embedding.reverse_embeddings_scale).astype(np.float32),
                _activation(embedding, owner),
            )
    elif mode == "int4" and _block(embedding) is None:
        table, head = _per_channel_embedding(embedding, integers, tied, owner)
    elif mode == "int4":
        block = _block(embedding)
        width = int(quantized_part(embedding, "orig_output_dim") or embedding.output_dim)
        if getattr(embedding, "inputs_quantizer", None) is not None:
            raise ExportError(f"{owner}: {embedding.name!r} is int4 with quantized inputs.")
        _check_groups(embedding, width, block, owner)
        q = _unpack_signed(integers, width, axis=-1)  # (vocabulary, width)
        scales = _value(embedding.embeddings_scale)  # (vocabulary, blocks)
        table = _asymmetric(q.T, scales.T, _value(embedding.embeddings_zero).T, block)
        head = None
        if not tied:
            reverse = _unpack_signed(_value(embedding.reverse_embeddings), width, axis=0)
            head = _asymmetric(
                reverse,
                _value(embedding.reverse_embeddings_scale),
                _value(embedding.reverse_embeddings_zero),
                block,
            )
    else:
        raise _refused(embedding, mode, owner)
    float_head = keras_dequantized(table if head is None else head)
    return table, head, np.ascontiguousarray(keras_dequantized(table).T), float_head


def _per_channel_embedding(embedding, integers, tied: bool, owner: str):
    """`(table, head or None)` of an Embedding Keras quantized int4 per channel: as int8,
    the integers in `[-8, 7]` (one scale per token; the untied head's per vocabulary)."""
    width = embedding.output_dim
    activation = _activation(embedding, owner)
    scales = _value(embedding.embeddings_scale).reshape(-1).astype(np.float32)
    table = KerasInt8(_unpack_signed(integers, width, axis=-1).T, scales, activation, bits=4)
    if tied:
        return table, None
    reverse = _unpack_signed(_value(embedding.reverse_embeddings), width, axis=0)
    reverse_scales = _value(embedding.reverse_embeddings_scale).reshape(-1).astype(np.float32)
    return table, KerasInt8(reverse, reverse_scales, activation, bits=4)


def _refused(layer, mode: str, owner: str) -> ExportError:
    return ExportError(
        f"{owner}: {type(layer).__name__} {layer.name!r} is quantized by Keras as {mode!r}, "
        f"which the export cannot write exactly; supported: {', '.join(SUPPORTED)} in "
        f"{', '.join(_READABLE)} layers. Export the float model (before `quantize()`)."
    )


def _mode_of(layer) -> str | None:
    """The layer's Keras quantization mode; None for a float layer, or a GPTQ / AWQ one
    never calibrated (it computes with its float kernel)."""
    if uncalibrated(layer):
        return None
    mode = getattr(layer, "quantization_mode", None)
    if mode is None:
        mode = getattr(getattr(layer, "dtype_policy", None), "quantization_mode", None)
    return str(mode) if mode else None


def _quantized(model) -> list:
    """`[(layer, mode)]` of every quantized layer of `model`, nested ones too."""
    from keras_posenc.backend.keras_private import all_layers

    return [(layer, _mode_of(layer)) for layer in all_layers(model) if _mode_of(layer)]


def refuse_unexportable(model, what: str = "save_decoder") -> str | None:
    """The Keras quantization mode of `model` (None: not quantized), or an ExportError
    naming the first layer whose mode or class the export cannot write, before any work.

    Raises:
        ExportError: float8, a layer class other than Dense / EinsumDense / Embedding /
            ReversibleEmbedding (gptq / awq: Dense / EinsumDense), or a mix of modes.
    """
    found = _quantized(model)
    owner = f"{what}: {model.name!r}"
    for layer, mode in found:
        readable = ("Dense", "EinsumDense") if mode in GROUPED_MODES else _READABLE
        if mode not in ("int8", "int4", *GROUPED_MODES) or type(layer).__name__ not in readable:
            raise _refused(layer, mode, owner)
    modes = sorted({mode for _, mode in found})
    if len(modes) > 1:
        raise ExportError(
            f"{owner} mixes Keras quantization modes ({', '.join(modes)}); the export "
            "writes one mode per model."
        )
    return modes[0] if modes else None


@contextlib.contextmanager
def unrounded_inputs(model):
    """Within the block, `model`'s int8 layers take their inputs unrounded (their
    `inputs_quantizer` off: Keras's weight-only int8 arithmetic); given back after."""
    changed = []
    for layer, _ in _quantized(model):
        if getattr(layer, "inputs_quantizer", None) is not None:
            changed.append((layer, layer.inputs_quantizer))
    try:
        for layer, _ in changed:
            layer.inputs_quantizer = None
        yield model
    finally:
        for layer, quantizer in changed:
            layer.inputs_quantizer = quantizer


_COLLECTED: contextvars.ContextVar[dict | None] = contextvars.ContextVar(
    "keras_quantized", default=None
)


@dataclasses.dataclass
class Collected:
    """What the readers read of quantized layers: `by_content` `{content_key(float (K, N)):
    stored}` and the ids of the layers read."""

    by_content: dict = dataclasses.field(default_factory=dict)
    layers: set = dataclasses.field(default_factory=set)


@contextlib.contextmanager
def collecting():
    """Within the block, the readers (`kernel_of`) note each quantized kernel they read;
    yields the `Collected`."""
    collected = Collected()
    token = _COLLECTED.set(collected)
    try:
        yield collected
    finally:
        _COLLECTED.reset(token)


def content_key(kernel: np.ndarray) -> tuple:
    kernel = np.ascontiguousarray(kernel, np.float32)
    return kernel.shape, hash(kernel.tobytes())


def kernel_of(layer, owner: str) -> np.ndarray:
    """The float32 kernel of a Dense / EinsumDense in its own shape: its `kernel`, or for a
    quantized layer what Keras computes with (noted for `collecting`)."""
    if not _mode_of(layer):
        return weight_array(layer.kernel)
    stored, dequantized = read_kernel(layer, owner)
    collected = _COLLECTED.get()
    if collected is not None:
        collected.by_content[content_key(dequantized)] = stored
        collected.layers.add(id(layer))
    shape = float_kernel_shape(layer)
    if _mode_of(layer) not in GROUPED_MODES and contracted_not_leading(layer):
        axes = kernel_axes(layer)
        return dequantized.reshape([shape[axis] for axis in axes]).transpose(np.argsort(axes))
    k = dequantized.shape[0]
    reduced = next(s for s in range(1, len(shape) + 1) if int(np.prod(shape[:s])) == k)
    return dequantized.reshape(*shape[:reduced], *shape[reduced:])


def stored_weights(model, named: list, collected: Collected, embedding: dict) -> dict:
    """`{name: stored}` of each of `named` (`[(name, kernel (K, N))]`, the description's
    projections) that a quantized layer holds, and `embedding` (`{"embed_tokens": ...,
    "lm_head": ...}`); the others are float layers.

    Raises:
        ExportError: a quantized layer of `model` the readers did not read as stored.
    """
    read = collected.layers | set(embedding.get("layers", ()))
    unread = sorted(layer.path for layer, _ in _quantized(model) if id(layer) not in read)
    if unread:
        raise ExportError(
            f"{model.name!r}: its quantized layers {unread} are not read by the export's "
            "reader of this model; export the float model."
        )
    stored = {key: value for key, value in embedding.items() if key != "layers"}
    for name, kernel in named:
        found = collected.by_content.get(content_key(kernel))
        if name not in stored and found is not None:  # the others: float layers
            stored[name] = found
    return stored
