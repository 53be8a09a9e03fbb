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
"""

from __future__ import annotations

import numpy as np

from keras_posenc.export.decoder.logit_tolerance import margin
from keras_posenc.export.decoder.quantized_check import activation_bound


def _prompt_ids(tokenizer, prompt: str) -> np.ndarray:
    """The prompt's ids as keras_hub's `generate()` gives them (with the start token)."""
    ids = [int(i) for i in np.asarray(tokenizer(prompt)).reshape(-1)]
    start = getattr(tokenizer, "start_token_id", None)
    return np.asarray([([] if start is None else [int(start)]) + ids], np.int32)


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


def judge_texts(result: dict, causal_lm, max_length: int, chain: int, block: int) -> dict:
    """`result` (`litertlm_check.check_litertlm`'s, run with the reference's weights: call
    this within the same `quantized_reference`) with each differing case judged by its
    margin (module docstring): `"near_tie"` and the margin and bound there; `"passed"`
    when every case is equal or a near tie."""
    from keras_posenc import keras_hub as bridge

    tokenizer = causal_lm.preprocessor.tokenizer
    greedy = bridge.keras_hub_greedy(causal_lm)
    for case in result["cases"]:
        if case["equal"]:
            continue
        prompt = _prompt_ids(tokenizer, case["prompt"])
        steps = max_length - prompt.shape[1]
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
