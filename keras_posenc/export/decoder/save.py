"""`save_decoder`: a decode-step model as onnxruntime-genai's folder (and a LiteRT file),
verified before it is kept."""

from __future__ import annotations

import functools
import importlib.util
import os
from pathlib import Path

import keras

from keras_posenc.export.decoder import progress as progress_lines
from keras_posenc.export.decoder.check import (
    decoder_cases,
    failure_message,
    verify_decoder,
)
from keras_posenc.export.decoder.entry import (
    checked_arguments,
    checked_quantizations,
    refuse_model_kind,
)
from keras_posenc.export.decoder.failed_report import (
    failed_report_path,  # noqa: F401 (save.failed_report_path, as before)
    keep_failed_report,
    remove_failed_report,
)
from keras_posenc.export.decoder.genai_config import genai_config
from keras_posenc.export.decoder.genai_runtime import genai_greedy, genai_model
from keras_posenc.export.decoder.greedy_generation import onnx_greedy
from keras_posenc.export.decoder.keras_reader import describe_decoder
from keras_posenc.export.decoder.litertlm_check import (
    check_litertlm,
    litertlm_failure,
    litertlm_reference,
)
from keras_posenc.export.decoder.on_demand import OneAtATime, on_demand
from keras_posenc.export.decoder.onnx_decoder import decoder_onnx
from keras_posenc.export.decoder.progress import Progress, check_verbose, reporting
from keras_posenc.export.decoder.quantization_arguments import keras_quantization
from keras_posenc.export.decoder.special_tokens import check_id_types, special_ids
from keras_posenc.export.decoder.tokenizer_files import tokenizer_files
from keras_posenc.export.decoder.weights_file import plan_weights, session_options, write_onnx
from keras_posenc.export.errors import VerificationError
from keras_posenc.export.files import whole_or_nothing, write_json, written_by_package
from keras_posenc.export.precision import exportable_model

DEFAULT_FORMATS = ("onnx",)


def _onnx_runtime(path: Path, max_length: int):
    import onnxruntime

    session = onnxruntime.InferenceSession(
        str(path), session_options(), providers=["CPUExecutionProvider"]
    )
    return lambda prompts, mask, steps: onnx_greedy(session, prompts, mask, steps, max_length)


def decoder_litert(decoder, quantization=None) -> bytes:
    """`litert_decoder.decoder_litert`, imported when called: its module imports TensorFlow,
    and the ONNX export runs on every backend."""
    from keras_posenc.export.decoder import litert_decoder

    return litert_decoder.decoder_litert(decoder, quantization)


def litert_greedy(path: Path, prompts, mask, steps: int):
    """`litert_runner.litert_greedy`, imported when called (see `decoder_litert`)."""
    from keras_posenc.export.decoder import litert_runner

    return litert_runner.litert_greedy(path, prompts, mask, steps)


def save_decoder(
    model,
    folder: str | os.PathLike,
    *,
    max_length: int,
    attention: str = "gqa",
    formats: tuple[str, ...] = DEFAULT_FORMATS,
    bfloat16: str = "float32",
    verify: bool = True,
    bos_token_id: int | None = None,
    eos_token_id: int | list[int] | None = None,
    pad_token_id: int | None = None,
    prefill_lengths: tuple[int, ...] | None = None,
    tokenizer=None,
    prompt_template: dict | None = None,
    external_data: bool | None = None,
    verbose: int = 1,
    quantize: str | None = None,
    block_size: int | None = None,
    accuracy_level: int | None = None,
    symmetric: bool = True,
    quantize_embedding: bool = False,
) -> dict:
    """Writes a decoder as onnxruntime-genai's folder (and LiteRT / LiteRT-LM files), verified.

    `model`: a `decoder_models` step model or a keras_hub CausalLM (docs/keras_hub.md).

    Example:

    ```python
    train, step = keras_posenc.decoder_models(embedding, blocks, norm, head, max_length=1024)
    report = save_decoder(step, "out/decoder", max_length=1024)  # raises if it fails
    ```

    Args:
        model, folder: the decode-step model; the folder to write (whole or not at all).
        max_length: cache slots and RoPE rows (prompt included): an integer from 2 to 2^24
            (from 9 with `verify`), checked before any work.
        attention: `"gqa"` (onnxruntime's GroupQueryAttention) or `"standard"` (ONNX ops).
        formats: from `"onnx"`, `"litert"` and `"litertlm"` (the files: docs/decoding.md).
        bfloat16: `"float32"`: a low-precision step model as float32 (warned); `"error"`.
        verify: verify every file against Keras (`check.py`) before the folder is kept.
        bos_token_id, eos_token_id, pad_token_id: None: the tokenizer's, else 0.
        prefill_lengths, tokenizer, prompt_template: `model.litertlm`'s (docs/litertlm.md).
        external_data: the weights in `model.onnx.data`; None: past 2 GB.
        verbose: 1 says each phase on stderr, 0 nothing.
        quantize, block_size, accuracy_level, symmetric, quantize_embedding: int8/int4
            weights (None: block 32, level 4; docs/quantization.md).

    Returns:
        The verification report (`{}` with `verify=False`; `folder/verification.json`).

    Raises:
        ExportError, TypeError, ValueError: what it cannot write, named before any work.
        VerificationError: a file does not generate as Keras does; its report is left at
            `failed_report_path(folder)` and nothing is written at `folder`.
    """
    bundle = (prefill_lengths, tokenizer, prompt_template)
    formats, max_length, lengths = checked_arguments(
        attention, formats, max_length, verify, bundle, external_data
    )
    asked = (quantize, block_size, accuracy_level, attention, formats)
    quantization = checked_quantizations(asked, symmetric, quantize_embedding)
    check_id_types(*(ids := (bos_token_id, eos_token_id, pad_token_id)))
    with reporting(progress := Progress(check_verbose(verbose), folder)):
        model, decoder, source, reference, slots = _described(model, max_length, bfloat16)
        quantization = keras_quantization(decoder, *asked) or quantization  # Keras's own
    plan = _plan(model, decoder, formats, max_length, (lengths, tokenizer, prompt_template, slots))
    weights = plan_weights(decoder, folder, formats, external_data)
    progress.say(_writing(formats, attention, folder))
    files = _files(model, decoder, formats, (attention, quantization), plan, ids)
    with whole_or_nothing(folder, kind="folder") as staging, reporting(progress):
        _write(files, staging, weights)
        files = decoder = None  # neither the graph nor the description held while verifying
        checked = (model, source, reference, min(max_length, slots), quantization, attention)
        written = (formats, max_length, plan)
        report = _verified(verify and checked, staging, written, progress, folder)
    remove_failed_report(folder)
    progress.say("done: " + ("every file verified" if verify else "written, not verified"))
    return report


def _raise_if_failed(report: dict, folder) -> None:
    """A VerificationError where a file failed, its report kept beside `folder`."""
    message = failure_message(report) or litertlm_failure(report)
    if message is not None:
        message += keep_failed_report(report, folder)
        raise VerificationError(message, report)


def _plan(model, decoder, formats, max_length: int, bundle: tuple):
    """The bundle's tokenizer and metadata (None without "litertlm"), checked before any
    file is written; `bundle` is `(prefill_lengths, tokenizer, prompt_template, slots)`,
    `slots` the cache slots of the reference."""
    prefill_lengths, tokenizer, template, slots = bundle
    if "litertlm" not in formats:  # tokenizer / template refused then (`checked_arguments`)
        return None
    from keras_posenc.export.decoder.litertlm import litertlm_plan  # imports TensorFlow

    if slots < max_length:
        raise ValueError(
            f"The step model's cache holds {slots} tokens and the bundle's check generates "
            f"up to max_length ({max_length}): build it with max_length >= {max_length}."
        )
    bundle = (prefill_lengths, tokenizer, template)
    return litertlm_plan(model, decoder.vocabulary, max_length, *bundle)


def _files(model, decoder, formats, attention: tuple, plan, token_ids: tuple) -> dict:
    """The content of each file of `formats` by name (`attention`: save_decoder's attention
    and its `Quantization` or None; `token_ids`: genai_config's bos, eos and pad ids,
    checked against the vocabulary first)."""
    files = {}
    if "onnx" in formats:
        ids = special_ids(model, decoder.vocabulary, *token_ids)
        # Emitted in the staging folder, its weights streamed to their file (weights_file.py).
        files["model.onnx"] = functools.partial(_onnx, decoder, *attention)
        files["genai_config.json"] = genai_config(decoder, **ids)
        files.update(tokenizer_files(model))
    if "litert" in formats:
        quantization = attention[1]  # the float call unchanged, as `_onnx`'s
        quantized = () if quantization is None else (quantization,)
        files["model.tflite"] = decoder_litert(decoder, *quantized)
    if plan is not None:
        from keras_posenc.export.decoder.litertlm import litertlm_file  # imports TensorFlow

        files["model.litertlm"] = litertlm_file(model, plan, attention[1])
    return files


def _onnx(decoder, attention: str, quantization):
    """`decoder_onnx`'s model; its float call unchanged (`decoder_onnx(decoder, attention)`)."""
    if quantization is None:
        return decoder_onnx(decoder, attention)
    return decoder_onnx(decoder, attention, quantization)


def _writing(formats: tuple[str, ...], attention: str, folder) -> str:
    """What the writing phase says: the files, the attention, and whether it replaces a
    folder an earlier save_decoder wrote (anything else there is refused by
    `whole_or_nothing`)."""
    said = f"writing {', '.join(_file_names(formats))} ({attention} attention)"
    if Path(folder).is_dir() and written_by_package(folder):
        said += ", replacing the folder an earlier save_decoder wrote there"
    return said


def _file_names(formats: tuple[str, ...]) -> list[str]:
    names = {
        "onnx": ["model.onnx", "genai_config.json"],
        "litert": ["model.tflite"],
        "litertlm": ["model.litertlm"],
    }
    return [name for kind in formats for name in names[kind]]


def _verified(checked, staging: Path, written: tuple, progress: Progress, folder) -> dict:
    """`{}` without `verify` (`checked` False), else the report of every file in
    `staging`, also written there (raising VerificationError where one failed): `_verify`'s
    cases (the ONNX and LiteRT files, `checked` its `(model, source, reference, length,
    quantization, attention)`, `source` the description on demand) and LiteRT-LM's engine's
    text, with the attention, Keras backend and formats it ran; `written` is `(formats,
    max_length, plan)`."""
    if not checked:
        return {}
    (formats, max_length, plan), model, slot = written, checked[0], OneAtATime()
    runtimes = _runtimes(staging, formats, max_length, checked[4], slot)
    arguments = (*checked[:3], runtimes, *checked[3:5], progress, slot.close)
    report = _verify(*arguments) if runtimes else {"cases": []}
    slot.close()
    if plan is not None:
        progress.say("generating text in LiteRT-LM's engine")
        path = staging / "model.litertlm"
        report["litertlm"] = _litertlm_result(path, model, plan, checked, progress)
    report["attention"] = checked[5]
    report["keras_backend"] = keras.backend.backend()  # what the reference ran on
    report["formats"] = list(formats)
    _raise_if_failed(report, folder)
    write_json(report, staging / "verification.json")
    return report


def _litertlm_result(path: Path, model, plan, checked, progress) -> dict:
    """The engine's texts against Keras's (of the dequantized model for a quantized
    bundle, with its .tflite teacher-forced: `litertlm_quantized.check_quantized_bundle`)."""
    check = functools.partial(check_litertlm, path, litertlm_reference(model, plan), plan)
    if checked[4] is None:
        return check()
    from keras_posenc.export.decoder.litertlm_quantized import check_quantized_bundle

    return check_quantized_bundle(check, path, checked, plan, progress)


def _verify(
    model,
    source,
    reference,
    runtimes: dict,
    length: int,
    quantization,
    progress: Progress,
    release,
) -> dict:
    """`verify_decoder`'s report, each case said through `progress`; `source` the
    description on demand (`on_demand.py`); `reference` None is Keras's greedy generation
    through the step model; `release` closes the runtimes before the float64 judge. A
    quantized file's: see `quantized_save.py`."""
    from keras_posenc.export.decoder.greedy_generation import keras_greedy

    if quantization is not None:
        from keras_posenc.export.decoder.quantized_save import verify_quantized_decoder

        keras_hub = reference is not None
        return verify_quantized_decoder(
            model, source, keras_hub, runtimes, length, quantization, progress
        )

    window = source.window
    count = len(decoder_cases(source.vocabulary, length, window=window)) + 1  # teacher-forced
    name = "Keras" if reference is None else "keras_hub"
    if reference is None:
        reference = lambda prompts, mask, steps: keras_greedy(model, prompts, mask, steps)  # noqa: E731
    reference, runtimes = progress.cases(reference, runtimes, count, name)
    return verify_decoder(
        model,
        runtimes,
        length,
        source.vocabulary,
        reference,
        window,
        decoder=source,
        reference_name=name,
        release=release,
    )


def _described(model, max_length: int, bfloat16: str):
    """`(model, decoder, source, reference, slots)`: the model verified against (a float32
    copy of a bfloat16 one), its description, the description on demand (`on_demand.py`:
    verification makes it again only where a judge needs it), the greedy reference (None:
    Keras's step model) and the cache slots the reference holds."""
    from keras_posenc import keras_hub as bridge  # here: the bridge imports this package

    progress_lines.phase(f"describing the model (max_length {max_length})")
    refuse_model_kind(model)
    hub = bridge.is_keras_hub_causal_lm(model)
    if hub:
        describe = functools.partial(bridge.describe_causal_lm, model, max_length)
    else:
        model, _ = exportable_model(model, bfloat16, copied=("bfloat16", "float16"))
        describe = functools.partial(describe_decoder, model, max_length)
    decoder = describe()  # refuses a model it cannot describe, naming the layer
    source = on_demand(decoder, describe)
    if hub:
        return model, decoder, source, bridge.keras_hub_greedy(model), max_length
    return model, decoder, source, None, model.inputs[1].shape[3]


def _write(files: dict, staging: Path, weights=None) -> None:
    """Writes `files` into `staging`, `model.onnx` as `weights` says (`weights_file.py`)."""
    staging.mkdir(parents=True, exist_ok=True)
    for name, content in files.items():
        if name.endswith(".onnx"):
            progress_lines.phase(f"write {name}")
            write_onnx(content, staging / name, weights)
        elif name.endswith(".json"):
            write_json(content, staging / name)
        else:
            (staging / name).write_bytes(content)


def _runtimes(
    staging: Path, formats: tuple[str, ...], max_length: int, quantization, slot=None
) -> dict:
    """One greedy runner per file written, by runtime name (and for a quantized file with
    int8 activations the same file with float arithmetic: `float_arithmetic_runtime`).
    The ONNX runtimes open at their first call, one at a time through `slot` (an
    `on_demand.OneAtATime`, or a new one): each holds the weights once more."""
    from keras_posenc.export.decoder.quantized_save import (
        float_arithmetic_runtime,
        litert_float_arithmetic_runtime,
    )

    runtimes, slot = {}, OneAtATime() if slot is None else slot
    if "onnx" in formats:
        onnx_path = staging / "model.onnx"  # each path its own name: read when a runtime runs
        runtimes["onnxruntime"] = slot.runtime(
            "onnxruntime", lambda: _onnx_runtime(onnx_path, max_length)
        )
        runtimes.update(float_arithmetic_runtime(onnx_path, max_length, quantization, slot))
        if importlib.util.find_spec("onnxruntime_genai") is not None:
            # A folder og cannot load is refused at its first run (ExportError).
            runtimes["onnxruntime-genai"] = slot.runtime(
                "onnxruntime-genai", lambda: genai_greedy(genai_model(staging), max_length)
            )
    if "litert" in formats:
        tflite_path = staging / "model.tflite"
        runtimes["litert"] = lambda prompts, mask, steps: litert_greedy(
            tflite_path, prompts, mask, steps
        )
        runtimes.update(litert_float_arithmetic_runtime(tflite_path, quantization))
    return runtimes
