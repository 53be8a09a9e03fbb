"""`save_decoder`: a decode-step model as onnxruntime-genai's folder (and a LiteRT file),
verified before it is kept."""

from __future__ import annotations

import os
from pathlib import Path

from keras_posenc.export.decoder.check import (
    decoder_cases,
    failure_message,
    verify_decoder,
    widest_window,
)
from keras_posenc.export.decoder.description import describe_decoder
from keras_posenc.export.decoder.entry import checked_max_length, refuse_model_kind
from keras_posenc.export.decoder.failed_report import (
    failed_report_path,  # noqa: F401 (save.failed_report_path, as before)
    keep_failed_report,
    remove_failed_report,
)
from keras_posenc.export.decoder.genai_config import genai_config
from keras_posenc.export.decoder.greedy import onnx_greedy
from keras_posenc.export.decoder.litert_decoder import decoder_litert, litert_greedy
from keras_posenc.export.decoder.onnx_decoder import decoder_onnx
from keras_posenc.export.decoder.progress import Progress, check_verbose
from keras_posenc.export.decoder.quantized_graph import checked_quantization
from keras_posenc.export.errors import VerificationError
from keras_posenc.export.files import whole_or_nothing, write_json, written_by_package
from keras_posenc.export.precision import exportable_model

ATTENTIONS = ("gqa", "standard")
FORMATS = ("onnx", "litert")
DEFAULT_FORMATS = ("onnx",)


def _onnx_runtime(path: Path, max_length: int):
    import onnxruntime

    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return lambda prompts, mask, steps: onnx_greedy(session, prompts, mask, steps, max_length)


def save_decoder(
    model,
    folder: str | os.PathLike,
    *,
    max_length: int,
    attention: str = "gqa",
    formats: tuple[str, ...] = DEFAULT_FORMATS,
    bfloat16: str = "float32",
    verify: bool = True,
    bos_token_id: int = 0,
    eos_token_id: int | list[int] | None = None,
    pad_token_id: int = 0,
    verbose: int = 1,
    quantize: str | None = None,
    block_size: int = 32,
    accuracy_level: int = 4,
) -> dict:
    """Writes `folder/model.onnx` and `folder/genai_config.json` (and `folder/model.tflite`).

    `model` is a step model made as `keras_posenc.decoder_models` makes it (Embedding,
    `DecoderBlock`s, RMSNormalization, Dense head; anything else is refused with an
    error naming the layer), or a keras_hub CausalLM of the families
    `keras_posenc.keras_hub` reads (verified against keras_hub's own greedy generation;
    docs/keras_hub.md). The ONNX file has onnxruntime-genai's decoder interface
    (`input_ids`, `attention_mask` -> `logits`, `past_key_values.{i}.key|value` ->
    `present.{i}.key|value` of shape `(batch, num_key_value_heads, max_length, head_dim)`,
    one buffer per layer bound as both); a token's position is the count of 1s before it
    in its row of `attention_mask` (left padding). The LiteRT file has litert-torch's
    `prefill` and `decode` signatures (`tokens`, `input_pos`, `mask`,
    `kv_cache_k_{i}|v_{i}` -> `logits` and the updated caches; see `litert_decoder.py`).

    Example:

    ```python
    train, step = keras_posenc.decoder_models(embedding, blocks, norm, head, max_length=1024)
    report = save_decoder(step, "out/decoder", max_length=1024)  # raises if it fails
    print(report["cases"][1]["runtimes"]["onnxruntime"]["max_abs_error"])
    ```

    Args:
        model: the decode-step model.
        folder: the folder to write (whole or not at all).
        max_length: cache slots and RoPE table rows of the export (prompt included): an
            integer (numpy's too) from 2 to 2^24 (from 9 with `verify`: its 8-token prompt
            and a step), checked before any work.
        attention: `"gqa"` (`com.microsoft.GroupQueryAttention`, onnxruntime) or
            `"standard"` (ONNX operators only for the attention).
        formats: the files to write and verify, from `"onnx"` (`model.onnx` and
            `genai_config.json`) and `"litert"` (`model.tflite`; not in the default: its
            converter is far slower than the ONNX writer, and a flatbuffer holds 2 GB).
        bfloat16: what to do with a model in any low-precision dtype (bfloat16, float16,
            mixed_bfloat16, mixed_float16; the files are float32): `"float32"` exports and
            verifies a float32 copy (with a warning naming the dtype), `"error"` refuses. A
            keras_hub model is always refused unless float32: its reference is keras_hub's
            own generation, so load it with `dtype="float32"`.
        verify: run the verification of `check.py` before the folder is kept.
        bos_token_id, eos_token_id, pad_token_id: for `genai_config.json`.
        verbose: 1 says each phase on stderr (describing, writing, each verification
            case and runtime; replacing the folder an earlier call wrote), 0 nothing.
        quantize, block_size, accuracy_level: int8/int4 MatMulNBits (docs/quantization.md).

    Returns:
        The verification report (`{}` with `verify=False`), also written as
        `folder/verification.json`; each case has one result per runtime
        (`"onnxruntime"`, `"litert"`).

    Raises:
        ExportError: a model or setting the export cannot write exactly (named, before
            any work: quantized layers, settings the description does not carry).
        TypeError, ValueError: `max_length` is not an integer in its range.
        VerificationError: the file does not generate as Keras does; the report is
            left at `failed_report_path(folder)` (not over a file of the user's) and
            nothing is written at `folder`.
    """
    quantizing = (quantize, block_size, accuracy_level)
    formats, max_length, quantization = _checked(attention, formats, max_length, verify, quantizing)
    progress = Progress(check_verbose(verbose), folder)
    model, decoder, reference, length = _described(model, max_length, bfloat16, progress)
    progress.say(f"writing {', '.join(_file_names(formats))} ({attention} attention)")
    files = {}
    if "onnx" in formats:
        files["model.onnx"] = _onnx(decoder, attention, quantization)
        files["genai_config.json"] = genai_config(
            decoder, bos_token_id=bos_token_id, eos_token_id=eos_token_id, pad_token_id=pad_token_id
        )
    if "litert" in formats:
        files["model.tflite"] = decoder_litert(decoder)
    replacing = Path(folder).is_dir() and written_by_package(folder)
    with whole_or_nothing(folder, kind="folder") as staging:
        _write(files, staging)
        report = {}
        if verify:
            runtimes = _runtimes(staging, formats, max_length, quantization)
            report = _verify(model, decoder, reference, runtimes, length, progress, quantization)
            _keep_or_raise(report, attention, formats, staging, folder)
        if replacing:
            progress.say("replacing the folder an earlier save_decoder wrote there")
    remove_failed_report(folder)
    progress.say("done: " + ("every file verified" if verify else "written, not verified"))
    return report


def _onnx(decoder, attention: str, quantization):
    """`decoder_onnx`'s model; its float call unchanged (`decoder_onnx(decoder, attention)`)."""
    if quantization is None:
        return decoder_onnx(decoder, attention)
    return decoder_onnx(decoder, attention, quantization)


def _keep_or_raise(report: dict, attention: str, formats, staging: Path, folder) -> None:
    """Writes the passed `report` into `staging`, or keeps it beside `folder` and raises."""
    report["attention"] = attention
    report["formats"] = list(formats)
    message = failure_message(report)
    if message is not None:
        message += keep_failed_report(report, folder)
        raise VerificationError(message, report)
    write_json(report, staging / "verification.json")


def _checked(attention: str, formats, max_length, verify: bool, quantizing) -> tuple:
    """`(formats, max_length, quantization)` checked, before any work (`quantizing`:
    save_decoder's `(quantize, block_size, accuracy_level)`)."""
    if attention not in ATTENTIONS:
        raise ValueError(f"attention must be one of {ATTENTIONS}, got {attention!r}.")
    formats = (formats,) if isinstance(formats, str) else tuple(formats)
    if not formats or any(kind not in FORMATS for kind in formats):
        raise ValueError(f"formats must be a non-empty subset of {FORMATS}, got {formats!r}.")
    max_length = checked_max_length(max_length, verify)
    return formats, max_length, checked_quantization(*quantizing, attention, formats)


def _file_names(formats: tuple[str, ...]) -> list[str]:
    names = {"onnx": ["model.onnx", "genai_config.json"], "litert": ["model.tflite"]}
    return [name for kind in formats for name in names[kind]]


def _verify(
    model, decoder, reference, runtimes: dict, length: int, progress: Progress, quantization
) -> dict:
    """`verify_decoder`'s report, each case said through `progress`; `reference` None is
    Keras's greedy generation through the step model. A quantized file's: see
    `quantized_save.py`."""
    from keras_posenc.export.decoder.greedy import keras_greedy

    if quantization is not None:
        from keras_posenc.export.decoder.quantized_save import verify_quantized_decoder

        keras_hub = reference is not None
        return verify_quantized_decoder(
            model, decoder, keras_hub, runtimes, length, quantization, progress
        )

    window = widest_window(decoder)
    count = len(decoder_cases(decoder.vocabulary, length, window=window))
    name = "Keras" if reference is None else "keras_hub"
    if reference is None:
        reference = lambda prompts, mask, steps: keras_greedy(model, prompts, mask, steps)  # noqa: E731
    reference, runtimes = progress.cases(reference, runtimes, count, name)
    return verify_decoder(model, runtimes, length, decoder.vocabulary, reference, window)


def _described(model, max_length: int, bfloat16: str, progress: Progress):
    """`(model, decoder, reference, length)`: the model verified against (a float32 copy of
    a bfloat16 one), its description, the greedy reference (None: Keras's step model) and
    the length verified (`max_length`, or fewer: the cache slots the reference holds)."""
    from keras_posenc import keras_hub as bridge  # here: the bridge imports this package

    progress.say(f"describing the model (max_length {max_length})")
    refuse_model_kind(model)
    if bridge.is_keras_hub_causal_lm(model):
        decoder = bridge.describe_causal_lm(model, max_length)
        found = model, decoder, bridge.keras_hub_greedy(model), max_length
    else:
        model, _ = exportable_model(model, bfloat16, copied=("bfloat16", "float16"))
        found = model, describe_decoder(model, max_length), None, model.inputs[1].shape[3]
    return (*found[:3], min(max_length, found[3]))


def _write(files: dict, staging: Path) -> None:
    import onnx

    staging.mkdir(parents=True, exist_ok=True)
    for name, content in files.items():
        if name.endswith(".onnx"):
            onnx.save_model(content, staging / name)
        elif name.endswith(".json"):
            write_json(content, staging / name)
        else:
            (staging / name).write_bytes(content)


def _runtimes(staging: Path, formats: tuple[str, ...], max_length: int, quantization) -> dict:
    """One greedy runner per file written, by runtime name (and for a quantized file with
    int8 activations the same file with float arithmetic: `float_arithmetic_runtime`)."""
    from keras_posenc.export.decoder.quantized_save import float_arithmetic_runtime

    runtimes = {}
    if "onnx" in formats:
        runtimes["onnxruntime"] = _onnx_runtime(staging / "model.onnx", max_length)
        path = staging / "model.onnx"
        runtimes.update(float_arithmetic_runtime(path, max_length, quantization))
    if "litert" in formats:
        path = staging / "model.tflite"
        runtimes["litert"] = lambda prompts, mask, steps: litert_greedy(path, prompts, mask, steps)
    return runtimes
