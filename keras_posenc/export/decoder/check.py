"""Verification of an exported decoder: Keras's greedy tokens, and logits within float32 tolerance.

Two cases: batch 1 without padding, and a batch of 4 prompts padded on the left by 0, 1,
2 and 3 tokens; each runs a prompt of `PROMPT` tokens in one call, then `STEPS` single
tokens (fewer where the cache has fewer slots), every runtime fed its own argmax. They
end at position `PROMPT + STEPS - 1` (71); a decoder with a sliding window below
`max_length` gets a third case that goes past its widest window (`long_case`), so a
wrong window is seen by the queries it hides keys from. Passed:
the tokens are identical, and every logit of the prompt's real tokens and of every step
is within `atol + rtol·rms(Keras row)` (atol 1e-5, rtol 1e-4: optimum's and transformers'
ONNX validation, with the relative part taken of the row's RMS, see `row_scale`). A
failure names the case, the step and the row of the worst logit, or of the first different
token.
"""

from __future__ import annotations

import numpy as np

ATOL, RTOL = 1e-5, 1e-4
PROMPT, STEPS = 8, 64
PADS = (0, 1, 2, 3)
# The long case: batch 2 (one row padded by 3), LONG_STEPS single tokens after a prompt
# that passes the window; to the cache's end where it has at most CHEAP_LENGTH slots,
# else LONG_PAST tokens past the window (a prompt of 4096 tokens costs one call).
LONG_PADS, LONG_STEPS, LONG_PAST, CHEAP_LENGTH = (0, 3), 8, 24, 256


def _padded(rng, vocabulary: int, pads, length: int) -> tuple[np.ndarray, np.ndarray]:
    """Random prompts `(len(pads), length)` with row `r` padded on the left by `pads[r]`."""
    prompts = rng.integers(1, vocabulary, (len(pads), length)).astype(np.int64)
    mask = np.ones_like(prompts)
    for row, pad in enumerate(pads):
        prompts[row, :pad], mask[row, :pad] = 0, 0
    return prompts, mask


def long_case(rng, vocabulary: int, max_length: int, window: int) -> dict:
    """The case past `window` (see the constants above): its unpadded row's last token
    at position `last_position`, every row's prompt longer than `window` where the
    cache has the room."""
    end = max_length if max_length <= CHEAP_LENGTH else min(max_length, window + LONG_PAST)
    steps = min(LONG_STEPS, end - PROMPT)
    prompts, mask = _padded(rng, vocabulary, LONG_PADS, end - steps)
    name = f"batch 2 past the window of {window} (one row left-padded)"
    return {"name": name, "prompts": prompts, "mask": mask, "steps": steps}


def widest_window(decoder) -> int | None:
    """The widest sliding window of `decoder` (a `Decoder`), or None: the description keeps
    only windows narrower than its `max_length`."""
    windows = [block.attention.window for block in decoder.blocks]
    return max((w for w in windows if w is not None), default=None)


def decoder_cases(
    vocabulary: int, max_length: int, seed: int = 0, window: int | None = None
) -> list[dict]:
    """`[{"name", "prompts", "mask", "steps"}]`: batch 1, and batch 4 left-padded; with a
    `window` below `max_length`, the case past it (`long_case`)."""
    if max_length < PROMPT + 1:
        raise ValueError(f"Verification needs max_length >= {PROMPT + 1}, got {max_length}.")
    rng = np.random.default_rng(seed)
    steps = min(STEPS, max_length - PROMPT)
    cases = []
    for name, pads in (("batch 1", (0,)), ("batch 4 left-padded", PADS)):
        prompts, mask = _padded(rng, vocabulary, pads, PROMPT)
        cases.append({"name": name, "prompts": prompts, "mask": mask, "steps": steps})
    if window is not None and window < max_length:
        cases.append(long_case(rng, vocabulary, max_length, window))
    return cases


def _errors(expected: np.ndarray, got: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`(abs error, relative error, excess over the tolerance)`, element by element."""
    expected, got = np.asarray(expected, np.float64), np.asarray(got, np.float64)
    absolute = np.abs(got - expected)
    absolute = np.where(np.isnan(absolute), np.inf, absolute)
    relative = absolute / np.maximum(np.abs(expected), np.finfo(np.float32).tiny)
    return absolute, relative, absolute - (ATOL + RTOL * row_scale(expected))


def row_scale(logits: np.ndarray) -> np.ndarray:
    """The RMS of each row of logits (last axis), what `RTOL` is relative to.

    A logit's float32 error comes from its row's hidden state and the head, not from its
    own size: one near 0 carries the error of the row's large ones (a Gemma 4 prompt of
    120 tokens: keras_hub's logits 3.4e-5 from a float64 decode where |logit| is 1e-3).
    """
    return np.sqrt(np.mean(np.square(logits), axis=-1, keepdims=True))


def compare_greedy(expected, got, mask: np.ndarray) -> dict:
    """Tokens and logits of one runtime against Keras's (`greedy.keras_greedy`'s outputs).

    Logits are compared up to the first step whose tokens differ (later ones follow other
    tokens). Step 0 is the prompt (its real tokens only); step `s` the `s`-th single token.
    """
    keras_tokens, keras_logits = expected
    tokens, logits = got
    differ = np.argwhere(keras_tokens != tokens)
    last = int(differ[:, 1].min()) if len(differ) else keras_tokens.shape[1] - 1
    worst = {"excess": -np.inf}
    max_abs = max_rel = 0.0
    for step in range(last + 1):
        if step == 0:  # the prompt's real tokens
            rows = np.nonzero(mask.astype(bool))
            a, r, e = _errors(keras_logits[0][rows], logits[0][rows])
            row_of = rows[0]
        else:
            a, r, e = _errors(keras_logits[step], logits[step])
            row_of = np.arange(a.shape[0])
        max_abs, max_rel = max(max_abs, float(a.max())), max(max_rel, float(r.max()))
        at = np.unravel_index(np.argmax(e), e.shape)
        if e[at] > worst["excess"]:
            worst = {"excess": float(e[at]), "step": step, "row": int(row_of[at[0]])}
    result = {
        "same_tokens": not len(differ),
        "max_abs_error": max_abs,
        "max_rel_error": max_rel,
        "worst_step": worst["step"],
        "worst_row": worst["row"],
        "within_tolerance": worst["excess"] <= 0,
    }
    if len(differ):
        step, row = int(differ[:, 1].min()), int(differ[differ[:, 1].argmin(), 0])
        result["first_different_token"] = {"step": step, "row": row}
    result["passed"] = result["same_tokens"] and result["within_tolerance"]
    return result


def failure_message(report: dict) -> str | None:
    """None when every runtime passed every case; otherwise what failed, and where."""
    failures = []
    for case in report["cases"]:
        for runtime, result in case["runtimes"].items():
            if result["passed"]:
                continue
            where = result.get("first_different_token")
            if where is not None:
                what = f"a different token at step {where['step']}, row {where['row']}"
            else:
                what = (
                    f"logits off by {result['max_abs_error']:.2e} (worst at step "
                    f"{result['worst_step']}, row {result['worst_row']}; allowed "
                    f"{ATOL:g} + {RTOL:g}·rms(Keras row))"
                )
            failures.append(f"{runtime}, {case['name']}: {what}")
    if not failures:
        return None
    return "The exported decoder does not generate as Keras does: " + "; ".join(failures) + "."


def verify_decoder(
    step_model,
    runtimes: dict,
    max_length: int,
    vocabulary: int,
    reference=None,
    window: int | None = None,
) -> dict:
    """Runs every case in Keras and in each of `runtimes` (`name -> greedy(prompts, mask,
    steps) -> (tokens, logits)`); returns the report (see `failure_message`). `reference`,
    a greedy function of the same form, replaces the step model's (`keras_greedy`) as what
    the runtimes must match (a keras_hub CausalLM's own generation); `window`, the
    decoder's widest sliding window (`widest_window`), adds the case past it."""
    from keras_posenc.export.decoder.greedy import keras_greedy

    if reference is None:
        reference = lambda prompts, mask, steps: keras_greedy(step_model, prompts, mask, steps)  # noqa: E731

    report = {"tolerance": {"atol": ATOL, "rtol": RTOL}, "cases": []}
    for case in decoder_cases(vocabulary, max_length, window=window):
        prompts, mask, steps = case["prompts"], case["mask"], case["steps"]
        expected = reference(prompts, mask, steps)
        results = {
            name: compare_greedy(expected, run(prompts, mask, steps), mask)
            for name, run in runtimes.items()
        }
        report["cases"].append(
            {
                "name": case["name"],
                "batch": len(prompts),
                "steps": steps,
                "last_position": prompts.shape[1] + steps - 1,
                "runtimes": results,
            }
        )
    report["passed"] = failure_message(report) is None
    return report
