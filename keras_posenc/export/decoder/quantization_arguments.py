"""`save_decoder`'s quantization arguments, checked before any work, as the `Quantization`
record a file is written and verified by: quantize-at-export (ONNX's MatMulNBits, LiteRT's
FULLY_CONNECTED), or a model Keras quantized (its own blocks: `keras_quantized.py`). An
argument the file would not carry (a block size for Keras's own blocks, an accuracy level
for LiteRT) is refused by name, never ignored.
"""

from __future__ import annotations

from keras_posenc.export.decoder.keras_quantized import KerasInt8
from keras_posenc.export.decoder.quantize import QUANTIZE_MODES, check_block_size
from keras_posenc.export.decoder.quantized_graph import Quantization
from keras_posenc.export.decoder.quantized_standard import FUSED_ACCURACY_LEVEL
from keras_posenc.export.errors import ExportError

ACCURACY_LEVELS = (0, 1, 2, 3, 4)
# save_decoder's block_size / accuracy_level when None: the genai builder's CPU defaults.
DEFAULT_BLOCK_SIZE, DEFAULT_ACCURACY_LEVEL = 32, 4
# LiteRT's blockwise FULLY_CONNECTED takes blocks that are multiples of this.
LITERT_BLOCK = 32


def checked_quantization(
    quantize_mode, block_size, accuracy_level, attention: str, formats: tuple, symmetric=True
) -> Quantization | None:
    """The `Quantization` of `save_decoder`'s arguments, or None (`quantize=None`).

    Raises:
        ValueError: a mode, block size, accuracy level or `symmetric` the runtime does not
            take.
        ExportError: ONNX and LiteRT in one call (they store other integers), an accuracy
            level other than 4 with standard ops (the file carries none), or asymmetric
            blocks in a LiteRT file (`refuse_asymmetric`).
    """
    if not isinstance(symmetric, bool):
        raise TypeError(f"symmetric must be True or False, got {symmetric!r}.")
    if accuracy_level is not None:
        _check_accuracy_level(accuracy_level)
    if quantize_mode is None:
        if not symmetric:
            raise ValueError(
                "symmetric=False asks for asymmetric blocks quantized at export, but "
                "quantize=None: pass quantize='int4' or 'int8' with it (a model Keras "
                "quantized keeps its own blocks), or leave symmetric at True."
            )
        if block_size is not None:  # read by no model: Keras's blocks are its own
            check_block_size(block_size)
        return None  # accuracy_level: `keras_quantization` decides once the model is read
    if quantize_mode not in QUANTIZE_MODES:
        raise ValueError(
            f"quantize must be None, 'int8' or 'int4' (MatMulNBits' 8 or 4 bits), got "
            f"{quantize_mode!r}."
        )
    bits = QUANTIZE_MODES[quantize_mode]
    if "onnx" not in formats:
        refuse_asymmetric(symmetric, formats)
        return litert_quantization(bits, block_size, accuracy_level)
    block_size = check_block_size(DEFAULT_BLOCK_SIZE if block_size is None else block_size)
    accuracy_level = DEFAULT_ACCURACY_LEVEL if accuracy_level is None else accuracy_level
    if attention == "standard" and accuracy_level != 4:
        raise ExportError(
            f"accuracy_level={accuracy_level!r} with attention='standard': the standard-op "
            "file (DequantizeLinear + MatMul) carries no accuracy level; onnxruntime fuses it "
            f"into MatMulNBits at the session's {FUSED_ACCURACY_LEVEL!r} (default 4). Leave "
            "accuracy_level at 4, or use attention='gqa'."
        )
    if any(kind != "onnx" for kind in formats):
        raise ExportError(
            f"quantize={quantize_mode!r} with formats={formats!r} is not supported: ONNX and "
            "LiteRT store other integers (MatMulNBits' scales keep their sign, LiteRT's are "
            "positive), so one reference cannot verify both; export each on its own."
        )
    return Quantization(bits, block_size, int(accuracy_level), symmetric=symmetric)


def _check_accuracy_level(accuracy_level) -> None:
    if isinstance(accuracy_level, bool) or accuracy_level not in ACCURACY_LEVELS:
        raise ValueError(
            f"accuracy_level must be one of {ACCURACY_LEVELS} (MatMulNBits' attribute), got "
            f"{accuracy_level!r}."
        )


def _refuse_unread(name: str, value, why: str) -> None:
    """An ExportError for an argument given (not None) that the file would not carry."""
    if value is not None:
        raise ExportError(f"{name}={value!r} is not used: {why}; leave {name} at None.")


def refuse_asymmetric(symmetric: bool, formats: tuple) -> None:
    """Refuses asymmetric blocks in a LiteRT file: its blockwise int4 and per-channel int8
    `FULLY_CONNECTED` weights are symmetric (no zero point)."""
    if not symmetric:
        raise ExportError(
            f"symmetric=False with formats={tuple(formats)!r}: LiteRT's quantized "
            "FULLY_CONNECTED weights (int8 per channel, int4 blockwise) are symmetric and take "
            "no zero points; leave symmetric=True, or export formats=('onnx',)."
        )


def litert_quantization(bits: int, block_size, accuracy_level=None) -> Quantization:
    """The `Quantization` of a LiteRT / LiteRT-LM file: int8 per output channel (LiteRT's
    dynamic-range FULLY_CONNECTED has no int8 blocks: a `block_size` is refused), int4 in
    blocks of `block_size` (None: 32), a multiple of 32 (LiteRT's blockwise kernel's rule);
    no accuracy level (MatMulNBits' attribute: refused)."""
    _refuse_unread("accuracy_level", accuracy_level, "LiteRT files carry no accuracy level")
    if bits == 8:
        _refuse_unread("block_size", block_size, "LiteRT's int8 weights are per channel")
        return Quantization(8, None, None, rule="litert")
    block_size = check_block_size(DEFAULT_BLOCK_SIZE if block_size is None else block_size)
    if block_size % LITERT_BLOCK:
        raise ValueError(
            f"block_size must be a multiple of {LITERT_BLOCK} for a LiteRT int4 file "
            f"(LiteRT's blockwise FULLY_CONNECTED), got {block_size}."
        )
    return Quantization(4, block_size, None, rule="litert")


def keras_quantization(decoder, quantize_mode, block_size, accuracy_level, attention, formats):
    """The `Quantization` of a model Keras quantized (`decoder.stored`), or None.

    Raises:
        ExportError: `quantize` or `block_size` given too (the model is quantized already:
            its blocks are its own), `accuracy_level` given where nothing reads it (a float
            model without `quantize`, Keras's int8 products), or an attention or format its
            weights are not written for yet.
    """
    if decoder.stored is None:
        if quantize_mode is None:
            for name, value in (("block_size", block_size), ("accuracy_level", accuracy_level)):
                _refuse_unread(name, value, "the model is float and quantize=None")
        return None
    if quantize_mode is not None:
        raise ExportError(
            f"quantize={quantize_mode!r}: the model is quantized by Keras already; its "
            "stored weights are exported as they are (pass quantize=None)."
        )
    _refuse_unread("block_size", block_size, "the model Keras quantized keeps its own blocks")
    refuse_keras_quantized(decoder, attention, formats)
    stored = list(decoder.stored.values())
    # gptq / awq: a layer's bits are its own (4, or 8 where a zero point needs them)
    kinds = {(type(s).__name__, getattr(s, "mode", s.bits)) for s in stored}
    if len(kinds) > 1:
        raise ExportError(f"the model mixes Keras quantizations {sorted(kinds)}; not exported.")
    if isinstance(stored[0], KerasInt8):  # rounded inputs: the widest row rounded together
        why = "Keras's rounded rows are multiplied exactly (MatMulInteger), at no level"
        _refuse_unread("accuracy_level", accuracy_level, why)
        widest = max(s.shape[0] for s in stored)
        mode = "int8" if stored[0].bits == 8 else "int4 per channel"
        return Quantization(stored[0].bits, widest, 0, keras=mode)
    mode = getattr(stored[0], "mode", "int4")  # gptq / awq: `keras_gptq.KerasGrouped`
    block = max(s.block_size for s in stored)  # the widest inputs rounded together
    bits = max(s.bits for s in stored)
    level = DEFAULT_ACCURACY_LEVEL if accuracy_level is None else accuracy_level
    return Quantization(bits, block, int(level), keras=mode)


def refuse_keras_quantized(decoder, attention: str, formats=("onnx",)) -> None:
    """Refuses, by name and before anything is written, what a model Keras quantized
    (`decoder.stored`) is not written for: standard-op attention (its stored integers are
    MatMulInteger / MatMulNBits, onnxruntime's), LiteRT files, and a mixture of experts."""
    if decoder.stored is None:
        return
    if attention != "gqa":
        raise ExportError(
            f"a model Keras quantized with attention={attention!r} is not yet supported (its "
            "stored integers are written as MatMulInteger / MatMulNBits, onnxruntime's own "
            "ops); use attention='gqa', or export the float32 model with quantize=."
        )
    litert = [kind for kind in formats if kind != "onnx"]
    if litert:
        raise ExportError(
            f"a model Keras quantized with formats={tuple(formats)!r} is not yet supported: "
            f"{', '.join(litert)} files are not written from Keras's stored integers; use "
            "formats=('onnx',), or export the float32 model with quantize= (LiteRT's rule)."
        )
    if any(block.mlp.kind == "moe" for block in decoder.blocks):
        raise ExportError(
            "a model Keras quantized with a mixture-of-experts MLP is not yet supported (QMoE "
            "is written from the float32 experts); export the float32 model with quantize=."
        )
