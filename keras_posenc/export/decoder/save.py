"""`save_decoder`: a decode-step model as onnxruntime-genai's folder, verified before it is kept."""

from __future__ import annotations

import os
from pathlib import Path

from keras_posenc.export.decoder.check import failure_message, verify_decoder
from keras_posenc.export.decoder.description import describe_decoder
from keras_posenc.export.decoder.genai_config import genai_config
from keras_posenc.export.decoder.greedy import onnx_greedy
from keras_posenc.export.decoder.onnx_decoder import decoder_onnx
from keras_posenc.export.errors import ExportError, VerificationError
from keras_posenc.export.files import whole_or_nothing, write_json

ATTENTIONS = ("gqa", "standard")


def _onnx_runtime(path: Path, max_length: int):
    import onnxruntime

    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
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
    verify: bool = True,
    bos_token_id: int = 0,
    eos_token_id: int | list[int] | None = None,
    pad_token_id: int = 0,
) -> dict:
    """Writes `folder/model.onnx` and `folder/genai_config.json` for a decode-step model.

    `model` is a step model made as `keras_posenc.decoder_models` makes it (Embedding,
    `DecoderBlock`s, RMSNormalization, Dense head; anything else is refused with an
    error naming the layer), or a keras_hub CausalLM of the families
    `keras_posenc.keras_hub` reads (verified against keras_hub's own greedy generation;
    docs/keras_hub.md). The ONNX file has onnxruntime-genai's decoder interface
    (`input_ids`, `attention_mask` -> `logits`, `past_key_values.{i}.key|value` ->
    `present.{i}.key|value` of shape `(batch, num_key_value_heads, max_length, head_dim)`,
    one buffer per layer bound as both); a token's position is the count of 1s before it
    in its row of `attention_mask` (left padding).

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
        verify: run the verification of `check.py` before the folder is kept.
        bos_token_id, eos_token_id, pad_token_id: for `genai_config.json`.

    Returns:
        The verification report (`{}` with `verify=False`), also written as
        `folder/verification.json`.

    Raises:
        ExportError: a model or setting the export cannot write exactly.
        VerificationError: the file does not generate as Keras does; the report is
            left at `failed_report_path(folder)` and nothing is written at `folder`.
    """
    if attention not in ATTENTIONS:
        raise ValueError(f"attention must be one of {ATTENTIONS}, got {attention!r}.")
    from keras_posenc import keras_hub as bridge  # here: the bridge imports this package

    reference, slots = None, None
    if bridge.is_keras_hub_causal_lm(model):
        if attention != "gqa":
            raise ExportError(
                f"A keras_hub {type(model).__name__} is exported with attention='gqa': the "
                f"{attention!r} path does not write its families' settings yet (biases, q/k "
                "norms, sliding windows, soft caps, post norms, per-layer RoPE tables)."
            )
        decoder = bridge.describe_causal_lm(model, max_length)
        reference, slots = bridge.keras_hub_greedy(model), max_length
    else:
        decoder = describe_decoder(model, max_length)
    onnx_model = decoder_onnx(decoder, attention)
    config = genai_config(
        decoder, bos_token_id=bos_token_id, eos_token_id=eos_token_id, pad_token_id=pad_token_id
    )
    with whole_or_nothing(folder, kind="folder") as staging:
        staging.mkdir(parents=True, exist_ok=True)
        import onnx

        onnx.save_model(onnx_model, staging / "model.onnx")
        write_json(config, staging / "genai_config.json")
        report = {}
        if verify:
            keras_slots = slots or model.inputs[1].shape[3]
            runtimes = {"onnxruntime": _onnx_runtime(staging / "model.onnx", max_length)}
            report = verify_decoder(
                model, runtimes, min(max_length, keras_slots), decoder.vocabulary, reference
            )
            report["attention"] = attention
            message = failure_message(report)
            if message is not None:
                write_json(report, failed_report_path(folder))
                raise VerificationError(message, report)
            write_json(report, staging / "verification.json")
    failed_report_path(folder).unlink(missing_ok=True)
    return report
