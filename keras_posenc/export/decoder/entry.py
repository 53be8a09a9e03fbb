"""`save_decoder`'s arguments, checked before any work: lengths, model kinds, quantization."""

from __future__ import annotations

from keras_posenc.export.backend import requires_tensorflow
from keras_posenc.export.decoder.check import PROMPT
from keras_posenc.export.decoder.keras_quantized import refuse_unexportable
from keras_posenc.export.decoder.litertlm_template import checked_prompt_template
from keras_posenc.export.decoder.quantization_arguments import checked_quantization
from keras_posenc.export.decoder.quantized_embedding import embedding_quantization
from keras_posenc.export.decoder.weights_file import use_external_data
from keras_posenc.export.errors import ExportError
from keras_posenc.export.precision import compute_dtypes
from keras_posenc.frequencies import MAX_POSITIONS
from keras_posenc.layers.checks import checked_int

# The positions a table serves: [0, MAX_POSITIONS).
LONGEST = MAX_POSITIONS
ATTENTIONS = ("gqa", "standard")
FORMATS = ("onnx", "litert", "litertlm")


def checked_max_length(max_length, verify: bool = False) -> int:
    """`max_length` as an int in `[2, 2^24]` (`[PROMPT + 1, 2^24]` when verified).

    Raises:
        TypeError: not an integer (bools, strings and floats are not).
        ValueError: outside that range.
    """
    if verify:
        hint = (
            f" The verification runs a prompt of {PROMPT} and at least one step "
            "(pass verify=False to write a shorter file unverified)."
        )
        return checked_int(max_length, "max_length", PROMPT + 1, LONGEST, hint)
    hint = " It is the cache slots and table rows (the prompt included)."
    return checked_int(max_length, "max_length", 2, LONGEST, hint)


def _is_keras_hub(model, base: str) -> bool:
    return any(
        cls.__name__ == base and cls.__module__.startswith("keras_hub.")
        for cls in type(model).__mro__
    )


def refuse_model_kind(model) -> None:
    """A keras_hub backbone (told to pass its CausalLM) or a model quantized in a mode the
    export cannot write, refused (Keras's int8 and int4 blocks are exported as stored)."""
    if _is_keras_hub(model, "Backbone"):
        family = type(model).__name__.removesuffix("Backbone") or "Llama"
        raise ExportError(
            f"{type(model).__name__} {model.name!r} is a keras_hub backbone: pass the CausalLM "
            f"(e.g. keras_hub.models.{family}CausalLM(backbone=backbone, preprocessor=None), "
            "or the one from_preset gives), whose generation the export is verified against."
        )
    # Keras's int8 / int4 / gptq / awq layers are read as stored; others refused by name.
    mode = refuse_unexportable(model, "save_decoder")
    low = [dtype for dtype in ("bfloat16", "float16") if dtype in compute_dtypes(model)]
    if mode in ("gptq", "awq") and low:
        raise ExportError(
            f"{model.name!r} is quantized by Keras as {mode!r} and computes in "
            f"{' and '.join(low)}: its float32 copy would lose the {mode} calibration (Keras "
            "rebuilds the layers uncalibrated), so it is not exported. Build the model in "
            f"float32, then quantize it with {mode!r}, and export that."
        )


def checked_arguments(
    attention: str, formats, max_length: int, verify: bool, bundle: tuple, external_data
) -> tuple:
    """`(formats, max_length, prefill_lengths)` checked, before any work (the bundle's
    lengths before the model is described for `max_length` and their padding), and
    `external_data`'s value; `bundle` is `(prefill_lengths, tokenizer, prompt_template)`,
    the last two refused without "litertlm" and the template checked here."""
    prefill_lengths, tokenizer, template = bundle
    if attention not in ATTENTIONS:
        raise ValueError(f"attention must be one of {ATTENTIONS}, got {attention!r}.")
    formats = (formats,) if isinstance(formats, str) else tuple(formats)
    if not formats or any(kind not in FORMATS for kind in formats):
        raise ValueError(f"formats must be a non-empty subset of {FORMATS}, got {formats!r}.")
    for kind in ("litert", "litertlm"):  # their converter reads a TensorFlow graph
        if kind in formats:
            requires_tensorflow(f"save_decoder(formats={kind})")
    max_length = checked_max_length(max_length, verify)
    if "litertlm" in formats:
        from keras_posenc.export.decoder.litertlm_model import bundle_prefill_lengths

        prefill_lengths = bundle_prefill_lengths(max_length, prefill_lengths)
        checked_prompt_template(template)
    else:
        for name, value in (("tokenizer", tokenizer), ("prompt_template", template)):
            if value is not None:
                raise ValueError(f"{name}= is written only into formats=('litertlm',)'s bundle.")
    use_external_data(0, external_data)  # a wrong value, before any work
    return formats, max_length, prefill_lengths


def checked_quantizations(asked: tuple, symmetric: bool, quantize_embedding: bool):
    """The `Quantization` that `asked` (`(quantize, block_size, accuracy_level, attention,
    formats)`), `symmetric` and `quantize_embedding` say, or None; refused by name first."""
    quantization = checked_quantization(*asked, symmetric)
    return embedding_quantization(quantization, quantize_embedding, asked[3])
