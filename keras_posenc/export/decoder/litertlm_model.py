"""The `.tflite` a LiteRT-LM bundle holds: the decoder of `litert_decoder.py` as the runtime
runs it.

LiteRT-LM's CPU executor refuses the plain file's dynamic shapes ("Only support batch
size 1 for now"; with static prefill but a batch of -1 on the caches, "KV cache and seq
len need to be dynamic or static at the same time"). This file has batch 1 in every
spec, one static `prefill_<n>` signature per length (the engine splits a prompt over them
and pads the last chunk) and `decode`; the same tensor names, int32 `tokens` and
`input_pos` (int64 tokens load and give wrong tokens silently) and the same graph.
`input_pos` holds one position per token, `(n,)`, the shape LiteRT-LM's executor fills
(and litert-torch writes); a `(1,)` one still ran, far off its prefill path
(`docs/litertlm.md` has the measurement).
"""

from __future__ import annotations

import tempfile

import tensorflow as tf

from keras_posenc.export.decoder.description import Decoder
from keras_posenc.export.decoder.litert_decoder import DecoderModule
from keras_posenc.export.errors import ExportError
from keras_posenc.frequencies import MAX_POSITIONS

DEFAULT_PREFILL_LENGTHS = (8, 32)


def default_prefill_lengths(max_length: int) -> tuple[int, ...]:
    """The lengths of `DEFAULT_PREFILL_LENGTHS` a bundle of `max_length` takes (each leaves
    a slot for a generated token), or `max_length - 1` where none does."""
    fitting = tuple(n for n in DEFAULT_PREFILL_LENGTHS if n <= max_length - 1)
    return fitting or (max_length - 1,)


def checked_prefill_lengths(prefill_lengths, max_length: int) -> tuple[int, ...]:
    """`prefill_lengths` as sorted distinct ints, each from 1 to `max_length`.

    Raises:
        ValueError: an empty choice, or a length not in 1...max_length.
    """
    lengths = tuple(sorted({int(n) for n in prefill_lengths}))
    if not lengths or lengths[0] < 1 or lengths[-1] > max_length:
        raise ValueError(
            f"prefill_lengths must be lengths from 1 to max_length ({max_length}), got "
            f"{tuple(prefill_lengths)!r}."
        )
    return lengths


def bundle_prefill_lengths(max_length: int, prefill_lengths=None) -> tuple[int, ...]:
    """`prefill_lengths` (None: `default_prefill_lengths`) checked against `max_length`,
    before any work.

    Raises:
        ValueError: a length past `max_length - 1`, or more cache slots than a file holds
            (`max_length` and the longest length's padding: see `BundlePlan.cache_slots`).
    """
    if prefill_lengths is None:
        lengths = default_prefill_lengths(max_length)
    else:
        lengths = checked_prefill_lengths(prefill_lengths, max_length - 1)
    if max_length + lengths[-1] > MAX_POSITIONS:
        raise ValueError(
            f"max_length {max_length} is more than a .litertlm bundle holds: its cache needs "
            f"max_length + the longest prefill length ({lengths[-1]}) slots, at most "
            f"{MAX_POSITIONS}."
        )
    return lengths


class StaticDecoderModule(DecoderModule):
    """`prefill_<n>` for each of `lengths` and `decode`, batch 1 everywhere."""

    def __init__(self, decoder: Decoder, lengths: tuple[int, ...], unfolded_norms: bool = False):
        tf.Module.__init__(self, name="decoder")
        self.decoder = decoder
        self.unfolded_norms = unfolded_norms
        self.slots = decoder.max_length
        self.cached = decoder.cached_layers()
        self.functions = {
            f"prefill_{n}": tf.function(self._step, input_signature=self._specs(n), autograph=False)
            for n in lengths
        }
        self.functions["decode"] = tf.function(
            self._step, input_signature=self._specs(1), autograph=False
        )

    def _specs(self, sequence: int | None) -> list[tf.TensorSpec]:
        # Batch 1 in every spec with a batch axis; `input_pos` `(sequence,)` has none.
        return [
            spec
            if spec.name == "input_pos"
            else tf.TensorSpec([1, *spec.shape[1:]], spec.dtype, name=spec.name)
            for spec in super()._specs(sequence)
        ]


def decoder_litertlm_tflite(
    decoder: Decoder, prefill_lengths=DEFAULT_PREFILL_LENGTHS, quantization=None
) -> bytes:
    """The `.tflite` bytes of `decoder` as LiteRT-LM runs it (module docstring); with
    `quantization`, its projections' weights int8 or int4 (`litert_quantize.py`).

    Raises:
        ExportError: the converter failed, or the file would need a Flex op.
        ValueError: `prefill_lengths` is not a choice of lengths within the cache.
    """
    lengths = checked_prefill_lengths(prefill_lengths, decoder.max_length)
    if quantization is not None:
        from keras_posenc.export.decoder.litert_quantize import quantized_litert
        from keras_posenc.export.decoder.quantized_graph import (
            quantized_kernels,
            refuse_unquantizable,
        )

        refuse_unquantizable(decoder, quantization)
        tflite = _converted(decoder, lengths, unfolded_norms=True)
        return quantized_litert(tflite, quantized_kernels(decoder), quantization)
    return _converted(decoder, lengths, unfolded_norms=False)


def _converted(decoder: Decoder, lengths: tuple[int, ...], unfolded_norms: bool) -> bytes:
    """`StaticDecoderModule(decoder, lengths, unfolded_norms)` converted, built-in ops only."""
    from keras_posenc.export.litert import litert_ops
    from keras_posenc.export.quiet import converter_output

    with (
        converter_output("tensorflow", "absl"),
        tempfile.TemporaryDirectory(prefix="keras_posenc_litertlm_") as folder,
    ):
        module = StaticDecoderModule(decoder, lengths, unfolded_norms)
        signatures = {name: f.get_concrete_function() for name, f in module.functions.items()}
        tf.saved_model.save(module, folder, signatures=signatures)
        converter = tf.lite.TFLiteConverter.from_saved_model(
            folder, signature_keys=list(signatures)
        )
        converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS]
        try:
            data = converter.convert()
        except Exception as error:
            raise ExportError(
                f"The LiteRT converter could not convert the decoder: {str(error)[-500:]}"
            ) from error
    flex = sorted(op for op in litert_ops(data) if op.startswith("Flex"))
    if flex:
        raise ExportError(f"The decoder's LiteRT file has Flex ops: {', '.join(flex)}.")
    return data
