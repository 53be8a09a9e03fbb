"""A quantized `.litertlm` bundle's texts judged against the dequantized reference's.

LiteRT's kernels round each input row of a quantized `FULLY_CONNECTED` to int8, so the
engine's logits differ from the dequantized Keras model's by that rounding
(`quantized_check.activation_bound`), and where the reference's top-1 leads its top-2 by
less than twice that bound the engine may take the other token, after which the texts
part. The engine gives text only: a prompt whose text differs passes when, at the token
of the reference's text where the two first differ (the engine's text equal before it,
so its tokens were the reference's), the reference's margin is within twice the bound
(a near tie); otherwise it fails, as `compare_with_bound` judges the LiteRT file's
teacher-forced tokens.

The text cannot show every weight, so the bundle's own `.tflite` (its bytes read back from
the bundle, `litertlm_runner.py`) is verified as the quantized `formats=("litert",)` file
is (`quantized_save.verify_quantized_decoder`: the same cases and judges), with the
teacher-forced case beside the greedy ones: every position `0..max_length-1` within the
int8-activation bound of the dequantized reference, and the same bytes with float arithmetic
(`litert_quantize.float_arithmetic_litert`) within float32 tolerance of it, so a wrong
bundle-side weight fails whatever the text. A step model (`tokenizer=`) is judged the same
way, its reference Keras's greedy generation (`greedy_generation.keras_greedy`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

from keras_posenc.export.decoder.litertlm_template import engine_ids
from keras_posenc.export.decoder.logit_tolerance import margin
from keras_posenc.export.decoder.quantized_check import activation_bound, dequantized_weights
from keras_posenc.export.decoder.quantized_save import (
    LITERT_FLOAT_RUNTIME,
    activation_block,
    quantization_entry,
    rounded_chain,
    verify_quantized_decoder,
)

# The runtime of the bundle's .tflite in the report (LITERT_FLOAT_RUNTIME: its float twin).
BUNDLE_TFLITE = "litert, the bundle's .tflite"


def _text(tokenizer, ids: np.ndarray) -> str:
    text = tokenizer.detokenize(ids)
    text = text.numpy() if hasattr(text, "numpy") else text
    return text.decode("utf-8") if isinstance(text, bytes) else str(text)


def _differing_step(tokenizer, generated: np.ndarray, reference: str, engine: str) -> int:
    """The generated step whose token's text covers the first character where `engine`
    leaves `reference`."""
    first = next(
        (i for i, (a, b) in enumerate(zip(reference, engine, strict=False)) if a != b),
        min(len(reference), len(engine)),
    )
    for step in range(len(generated)):
        if len(_text(tokenizer, generated[: step + 1])) > first:
            return step
    return len(generated) - 1


def _greedy(model):
    """Keras's greedy generation of keras_hub CausalLM or step model `model`."""
    from keras_posenc import keras_hub as bridge
    from keras_posenc.export.decoder.greedy_generation import keras_greedy

    if bridge.is_keras_hub_causal_lm(model):
        return bridge.keras_hub_greedy(model)
    return lambda prompts, mask, steps: keras_greedy(model, prompts, mask, steps)


def judge_texts(result: dict, model, plan, chain: int, block: int) -> dict:
    """`result` (`litertlm_check.check_litertlm`'s, run with the reference's weights: call
    this within the same `dequantized_weights`) with each differing case judged by its
    margin (module docstring): `"near_tie"` and the margin and bound there; `"passed"`
    when every case is equal or a near tie. `plan`: the bundle's `BundlePlan`."""
    tokenizer, greedy = plan.keras_tokenizer, _greedy(model)
    for case in result["cases"]:
        if case["equal"]:
            continue
        ids = engine_ids(tokenizer, plan.prompt_template, case["prompt"], plan.start_token)
        prompt = np.asarray([ids], np.int32)
        steps = plan.max_length - prompt.shape[1]
        tokens, logits = greedy(prompt, np.ones_like(prompt), steps)
        generated = tokens[0, : steps + 1]
        step = _differing_step(tokenizer, generated, case["keras_hub"], case["litert_lm"])
        row = np.asarray(logits[step][0, -1] if step == 0 else logits[step][0], np.float64)
        bound = float(activation_bound(row[None], chain, block)[0, 0])
        case["differing_step"] = step
        case["reference_margin"] = float(margin(row[None])[0])
        case["bound"] = bound
        case["near_tie"] = case["reference_margin"] <= 2 * bound
    result["passed"] = bool(result["cases"]) and all(
        c["equal"] or c["near_tie"] for c in result["cases"]
    )
    result["judged"] = "text equal, or parting at a near tie of the dequantized reference"
    return result


def check_quantized_bundle(
    check: Callable[[], dict], path: Path, checked: tuple, plan, progress
) -> dict:
    """`check()` (`litertlm_check.check_litertlm` of the bundle at `path`) run with the
    model as the reference (its quantized weights dequantized), its differing texts judged
    by the reference's margin (`judge_texts`), and the bundle's `.tflite` verified as the
    quantized LiteRT file is, teacher-forced too (module docstring), under `"tflite"`.
    `checked`: `save_decoder`'s `(model, source, reference, length, quantization, ...)`."""
    from keras_posenc.export.decoder.litert_quantize import float_arithmetic_litert
    from keras_posenc.export.decoder.litertlm_runner import bundle_greedy, bundle_tflite
    from keras_posenc.export.decoder.on_demand import on_demand

    model, source, reference, length, quantization = checked[:5]
    decoder = on_demand(source).describe()
    chain, block = rounded_chain(decoder), activation_block(decoder, quantization)
    with dequantized_weights(model, decoder, quantization):
        decoder = None  # the context holds it until it has made the reference's weights
        result = judge_texts(check(), model, plan, chain, block)
    result["quantization"] = quantization_entry(quantization, block, bounded=True)
    content = bundle_tflite(path)
    runtimes = {
        BUNDLE_TFLITE: bundle_greedy(content),
        LITERT_FLOAT_RUNTIME: bundle_greedy(float_arithmetic_litert(content)),
    }
    progress.say("verifying the bundle's .tflite, teacher-forced too")
    keras_hub = reference is not None
    tflite = verify_quantized_decoder(
        model, source, keras_hub, runtimes, length, quantization, progress, teacher_forced=True
    )
    result["tflite"] = tflite
    result["passed"] = result["passed"] and tflite["passed"]
    return result
