"""`save_decoder`: a decode-step model as onnxruntime-genai's folder (and a LiteRT file),
verified before it is kept."""

from __future__ import annotations

import functools
import os
from pathlib import Path

from keras_posenc.export.decoder import progress as progress_lines
from keras_posenc.export.decoder.check import failure_message, verify_decoder, widest_window
from keras_posenc.export.decoder.description import describe_decoder
from keras_posenc.export.decoder.genai_config import genai_config
from keras_posenc.export.decoder.greedy import onnx_greedy
from keras_posenc.export.decoder.litert_decoder import decoder_litert, litert_greedy
from keras_posenc.export.decoder.onnx_decoder import decoder_onnx
from keras_posenc.export.decoder.progress import Progress, reporting
from keras_posenc.export.decoder.weights_file import (
    plan_weights,
    session_options,
    use_external_data,
    write_onnx,
)
from keras_posenc.export.errors import VerificationError
from keras_posenc.export.files import whole_or_nothing, write_json
from keras_posenc.export.precision import exportable_model

ATTENTIONS = ("gqa", "standard")
FORMATS = ("onnx", "litert")
DEFAULT_FORMATS = ("onnx",)


def _onnx_runtime(path: Path, max_length: int):
    import onnxruntime

    session = onnxruntime.InferenceSession(
        str(path), session_options(), providers=["CPUExecutionProvider"]
    )
    return lambda prompts, mask, steps: onnx_greedy(session, prompts, mask, steps, max_length)


def failed_report_path(folder: str | os.PathLike) -> Path:
    """Where `save_decoder` leaves the report of a failed verification (next to `folder`)."""
    folder = Path(folder)
    return folder.with_name(folder.name + ".verification-failed.json")


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
    external_data: bool | None = None,
    verbose: int = 1,
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
        max_length: cache slots and RoPE table rows of the export (prompt included).
        attention: `"gqa"` (`com.microsoft.GroupQueryAttention`, onnxruntime) or
            `"standard"` (ONNX operators only for the attention).
        formats: the files to write and verify, from `"onnx"` (`model.onnx` and
            `genai_config.json`) and `"litert"` (`model.tflite`). LiteRT is not in the
            default: its converter takes 60-80x the time of writing the ONNX graph
            (7.7 s and 34 s for 3.5M and 25M parameters, against 0.1 s and 0.6 s), and
            a plain flatbuffer holds at most 2 GB.
        bfloat16: what to do with a bfloat16 model (the files are float32): `"float32"`
            exports and verifies a float32 copy (with a warning), `"error"` refuses. A
            keras_hub model is always refused unless float32: its reference is keras_hub's
            own generation, so load it with `dtype="float32"`.
        verify: run the verification of `check.py` before the folder is kept.
        bos_token_id, eos_token_id, pad_token_id: for `genai_config.json`.
        external_data: whether the weights go to `model.onnx.data` next to `model.onnx`
            (onnx's external data; `weights_file.py`): `None` when they pass 2 GB (what
            one protobuf holds), or `True` / `False` to force it.
        verbose: `0` quiet, `1` each phase and layer progress on stderr.

    Returns:
        The verification report (`{}` with `verify=False`), also written as
        `folder/verification.json`; each case has one result per runtime
        (`"onnxruntime"`, `"litert"`).

    Raises:
        ExportError: a model or setting the export cannot write exactly.
        VerificationError: the file does not generate as Keras does; the report is
            left at `failed_report_path(folder)` and nothing is written at `folder`.
    """
    if attention not in ATTENTIONS:
        raise ValueError(f"attention must be one of {ATTENTIONS}, got {attention!r}.")
    formats = (formats,) if isinstance(formats, str) else tuple(formats)
    if not formats or any(kind not in FORMATS for kind in formats):
        raise ValueError(f"formats must be a non-empty subset of {FORMATS}, got {formats!r}.")
    use_external_data(0, external_data)  # a wrong value, before any work
    progress = Progress(verbose).phase("describe")
    with reporting(progress):
        model, decoder, reference, slots = _described(model, max_length, bfloat16)
    plan = plan_weights(decoder, folder, formats, external_data)
    ids = dict(bos_token_id=bos_token_id, eos_token_id=eos_token_id, pad_token_id=pad_token_id)
    files = _files(decoder, formats, attention, ids, progress)
    vocabulary, window = decoder.vocabulary, widest_window(decoder)
    with whole_or_nothing(folder, kind="folder") as staging, reporting(progress):
        _write(files, staging, plan)
        files = decoder = None  # the description's weights: not held while verifying
        report = {}
        if verify:
            progress.phase("verify")
            runtimes = _runtimes(staging, formats, max_length)
            slots = min(max_length, slots)
            report = verify_decoder(model, runtimes, slots, vocabulary, reference, window)
            report["attention"] = attention
            report["formats"] = list(formats)
            message = failure_message(report)
            if message is not None:
                write_json(report, failed_report_path(folder))
                raise VerificationError(message, report)
            write_json(report, staging / "verification.json")
    failed_report_path(folder).unlink(missing_ok=True)
    return report


def _described(model, max_length: int, bfloat16: str):
    """`(model, decoder, reference, slots)`: the model verified against (a float32 copy of a
    bfloat16 one), its description, the greedy reference (None: Keras's step model) and the
    cache slots the reference holds."""
    from keras_posenc import keras_hub as bridge  # here: the bridge imports this package

    if bridge.is_keras_hub_causal_lm(model):
        decoder = bridge.describe_causal_lm(model, max_length)
        return model, decoder, bridge.keras_hub_greedy(model), max_length
    model, _ = exportable_model(model, bfloat16)
    return model, describe_decoder(model, max_length), None, model.inputs[1].shape[3]


def _files(decoder, formats: tuple[str, ...], attention: str, ids: dict, progress) -> dict:
    """The files to write by name; `model.onnx` as the function that emits it, called in
    the staging folder so that its weights stream to their file (`weights_file.py`)."""
    files = {}
    if "onnx" in formats:
        files["model.onnx"] = functools.partial(decoder_onnx, decoder, attention)
        files["genai_config.json"] = genai_config(decoder, **ids)
    if "litert" in formats:
        progress.phase("write model.tflite")
        files["model.tflite"] = decoder_litert(decoder)
    return files


def _write(files: dict, staging: Path, plan=None) -> None:
    """Writes `files` into `staging`, `model.onnx` as `plan` says (`weights_file.py`)."""
    staging.mkdir(parents=True, exist_ok=True)
    for name, content in files.items():
        if name.endswith(".onnx"):
            progress_lines.phase(f"write {name}")
            write_onnx(content, staging / name, plan)
        elif name.endswith(".json"):
            write_json(content, staging / name)
        else:
            (staging / name).write_bytes(content)


def _runtimes(staging: Path, formats: tuple[str, ...], max_length: int) -> dict:
    """One greedy runner per file written, by runtime name."""
    runtimes = {}
    if "onnx" in formats:
        runtimes["onnxruntime"] = _onnx_runtime(staging / "model.onnx", max_length)
    if "litert" in formats:
        path = staging / "model.tflite"
        runtimes["litert"] = lambda prompts, mask, steps: litert_greedy(path, prompts, mask, steps)
    return runtimes
