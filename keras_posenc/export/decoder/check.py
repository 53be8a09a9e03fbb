"""Verification of an exported decoder: the reference's tokens, and logits within float32 tolerance.

Greedy cases: batch 1 without padding, and a batch of 4 prompts padded on the left by 0,
1, 2 and 3 tokens; each runs a prompt of `PROMPT` tokens in one call, then `STEPS` single
tokens (fewer where the cache has fewer slots), every runtime fed its own argmax. They
end at position `PROMPT + STEPS - 1` (71); a decoder with a sliding window below
`max_length` gets a case that goes past its widest window (`long_case`), so a wrong
window is seen by the queries it hides keys from. The teacher-forced case
(`teacher_forced_case`) then reaches every position the file can be asked for: a random
prompt of `max_length` tokens in one call (batch 1), its logits compared at every
position 0..max_length-1, so a defect that shows only past the greedy cases (a table
row, a chunk, a window, a scaling switch) is seen.

Passed: the tokens are the reference's, and every logit of the prompt's real tokens and
of every step is within `atol + rtol·rms(reference row)` (atol 1e-5, rtol 1e-4: optimum's
and transformers' ONNX validation, with the relative part taken of the row's RMS, see
`logit_tolerance.py`). Where the reference's choice is itself within rounding of another (an
argmax tie, a mixture of experts' router tie) either is right, and where the reference is
the less exact float32 computation, a float64 decode of the description decides: see
`judge.py`. A failure names the case, the step, the row and the position of the worst
logit or of the first different token, and the reference's and the file's distances
from the float64 decode where it was run.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from keras_posenc.export.decoder import progress
from keras_posenc.export.decoder.logit_tolerance import (
    ATOL,
    BLOCK_LOGITS,
    RTOL,
    TIE,
    bound,
    compared,
    margin,
    positions,
)

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


def teacher_forced_case(vocabulary: int, max_length: int, seed: int = 1) -> dict:
    """Batch 1, a random prompt of `max_length` tokens run in one call and no step: its
    logits are those of every position `0..max_length-1`, each following the prompt's own
    tokens (teacher-forced). One call: onnxruntime's GroupQueryAttention refuses a
    multi-token call after the prompt at batch > 1, and a prefill is its cheapest path."""
    prompts, mask = _padded(np.random.default_rng(seed), vocabulary, (0,), max_length)
    name = f"teacher-forced, positions 0..{max_length - 1} (batch 1, one call)"
    return {"name": name, "prompts": prompts, "mask": mask, "steps": 0}


def _errors(expected: np.ndarray, got: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`(abs error, relative error, excess over the tolerance)`, element by element."""
    expected, got = np.asarray(expected, np.float64), np.asarray(got, np.float64)
    absolute = np.abs(got - expected)
    absolute = np.where(np.isnan(absolute), np.inf, absolute)
    relative = absolute / np.maximum(np.abs(expected), np.finfo(np.float32).tiny)
    return absolute, relative, absolute - bound(expected)


def _different_argmax(expected, got, index: tuple, skip: np.ndarray) -> np.ndarray:
    """The numbers `i` of the rows `index` (a tuple of index arrays into `expected` and
    `got`, logits on the last axis) whose argmax differs, but where `skip[i]`; a block of
    rows at a time."""
    block = max(1, BLOCK_LOGITS // expected.shape[-1])
    found = [np.zeros(0, np.int64)]
    for i in range(0, len(index[0]), block):
        part = tuple(axis[i : i + block] for axis in index)
        differ = np.argmax(expected[part], -1) != np.argmax(got[part], -1)
        found.append(i + np.nonzero(differ & ~skip[i : i + block])[0])
    return np.concatenate(found)


def compare_greedy(expected, got, mask: np.ndarray, released=None) -> dict:
    """Tokens and logits of one runtime against the reference's (`greedy_generation.keras_greedy`'s
    layout).

    Logits are compared up to the first step whose tokens differ (later ones follow other
    tokens). Step 0 is the prompt (its real tokens only); step `s` the `s`-th single token.
    A prompt row whose argmax differs from the reference's by more than a tie (its margin
    over `TIE` times its tolerance) fails too; within it, it is listed in `"ties"`.
    `released` `(batch,)`: the position from which each row is not compared (default:
    none).
    """
    keras_tokens, keras_logits = expected
    tokens, logits = got
    steps = keras_tokens.shape[1] - 1
    selected = compared(mask, steps, released)
    at = positions(mask, steps)
    # The token of step s is the argmax of step s's logits (step 0: the prompt's last).
    token_rows = np.stack([selected[0][:, -1], *selected[1:]], axis=1)
    differ = np.argwhere((keras_tokens != tokens) & token_rows)
    last = int(differ[:, 1].min()) if len(differ) else steps
    worst = {"excess": -np.inf, "step": 0, "row": 0, "position": 0}
    max_abs = max_rel = 0.0
    argmax, ties = None, []
    for step in range(last + 1):
        # (rows, columns) of the prompt's compared logits, (rows,) of a step's: read a
        # block at a time, never copied whole (1024 rows of 128256 logits are 0.5 GB).
        index = np.nonzero(selected[step])
        want, have = keras_logits[step], logits[step]
        row_of, where = index[0], at[step][index]
        if step == 0:
            # Every prompt row's argmax, but the last column's: that is step 0's token.
            wrong = _different_argmax(want, have, index, index[1] == mask.shape[1] - 1)
            picked = tuple(axis[wrong] for axis in index)
            gaps, allowed = margin(want[picked]), TIE * bound(want[picked])[..., 0]
            for i, gap, limit in zip(wrong, gaps, allowed, strict=True):
                where_i = {"row": int(row_of[i]), "position": int(where[i]), "margin": float(gap)}
                if gap > limit:
                    argmax = argmax or where_i
                else:
                    ties.append({"kind": "argmax", "step": 0, **where_i, "bound": float(limit)})
        # In blocks of rows: a long prompt's float64 errors would be 6 copies of its logits.
        block = max(1, BLOCK_LOGITS // want.shape[-1])
        for i in range(0, len(row_of), block):
            part = tuple(axis[i : i + block] for axis in index)
            a, r, e = _errors(want[part], have[part])
            max_abs, max_rel = max(max_abs, float(a.max())), max(max_rel, float(r.max()))
            j = i + np.unravel_index(np.argmax(e), e.shape)[0]
            if e.max() > worst["excess"]:
                worst = {"excess": float(e.max()), "step": step, "row": int(row_of[j])}
                worst["position"] = int(where[j])
    result = {
        "same_tokens": not len(differ),
        "max_abs_error": max_abs,
        "max_rel_error": max_rel,
        "worst_step": worst["step"],
        "worst_row": worst["row"],
        "worst_position": worst["position"],
        "within_tolerance": worst["excess"] <= 0,
        "ties": ties,
    }
    if len(differ):
        step, row = int(differ[:, 1].min()), int(differ[differ[:, 1].argmin(), 0])
        position = int(at[0][row, -1] if step == 0 else at[step][row])
        result["first_different_token"] = {"step": step, "row": row, "position": position}
    if argmax is not None:
        result["first_different_argmax"] = argmax
    result["passed"] = result["same_tokens"] and result["within_tolerance"] and argmax is None
    return result


def _what(result: dict, reference: str) -> str:
    """What failed in one runtime's `result`, and where."""
    token = result.get("first_different_token")
    argmax = result.get("first_different_argmax")
    if token is not None:
        return (
            f"a different token at step {token['step']}, row {token['row']} (position "
            f"{token['position']}; {reference}'s margin over its next token is wider than "
            "a rounding tie)"
        )
    if argmax is not None:
        return (
            f"a different argmax at position {argmax['position']}, row {argmax['row']} "
            f"({reference}'s margin {argmax['margin']:.2e}, wider than a rounding tie)"
        )
    what = (
        f"logits off by {result['max_abs_error']:.2e} from {reference} (worst at step "
        f"{result['worst_step']}, row {result['worst_row']}, position "
        f"{result['worst_position']}; allowed {ATOL:g} + {RTOL:g}·rms({reference} row))"
    )
    exact = result.get("float64")
    if exact is not None:
        what += (
            f"; against a float64 decode of the description the file is "
            f"{exact['file']['max_abs_error']:.2e} off ({exact['file']['tolerances']:.2g} "
            f"tolerances), {reference} {exact['reference']['max_abs_error']:.2e} "
            f"({exact['reference']['tolerances']:.2g}): {exact['cause']}"
        )
    return what


def failure_message(report: dict) -> str | None:
    """None when every runtime passed every case; otherwise what failed, and where."""
    reference = report.get("reference", "Keras")
    failures = [
        f"{runtime}, {case['name']}: {_what(result, reference)}"
        for case in report["cases"]
        for runtime, result in case["runtimes"].items()
        if not result["passed"]
    ]
    if not failures:
        return None
    return (
        f"The exported decoder does not generate as {reference} does: " + "; ".join(failures) + "."
    )


def _compared(case: dict, expected, run, released) -> tuple[dict, tuple | None]:
    """One runtime's result in one case: its greedy run along the reference's path
    (`judge.follow`), compared; and the run (`(tokens, logits)`) where only its logits
    fail, for the float64 judge (`_judge_logits`), else None."""
    from keras_posenc.export.decoder import judge

    prompts, mask, steps = case["prompts"], case["mask"], case["steps"]
    got, ties = judge.follow(run, expected, prompts, mask, steps, released)
    result = compare_greedy(expected, got, mask, released)
    result["ties"] = sorted(ties + result["ties"], key=lambda t: (t["step"], t["position"]))
    plain_logits = result["same_tokens"] and "first_different_argmax" not in result
    return result, (got if not result["passed"] and plain_logits else None)


def _judge_logits(cases, expected, exacts, releases, results, failed: dict) -> None:
    """Holds each run of `failed` (`{case index: [(runtime, (tokens, logits))]}`, popped
    as judged) to its case's float64 decode (`judge.against_float64`), setting its
    result's `"float64"` and `"passed"`: each case's decode made once for its runtimes,
    then let go (`exacts[index]`, a thunk of it, dropped)."""
    from keras_posenc.export.decoder import judge

    for index in sorted(failed):
        runs = failed.pop(index)
        case, names = cases[index], ", ".join(name for name, _ in runs)
        progress.say(
            f"judging case {index + 1} of {len(cases)}: the logits of {names} are past the "
            "tolerance from the reference's; held to a float64 decode"
        )
        exact = exacts[index]()[0]  # the description made again, said by `_exact`
        released = None if releases[index] is None else releases[index][0]
        while runs:
            name, got = runs.pop()
            verdict = judge.against_float64(
                expected[index], got, exact, case["mask"], case["steps"], released
            )
            results[index][name]["float64"] = verdict
            results[index][name]["passed"] = verdict["passed"]
        exact = exacts[index] = None


def verify_decoder(
    step_model,
    runtimes: dict,
    max_length: int,
    vocabulary: int,
    reference=None,
    window: int | None = None,
    decoder=None,
    reference_name: str = "Keras",
    release: Callable[[], None] | None = None,
) -> dict:
    """Runs every case in the reference and in each of `runtimes` (`name -> greedy(prompts,
    mask, steps) -> (tokens, logits)`); returns the report (see `failure_message`).

    The reference runs every case first; then each runtime runs every case in turn, so
    runtimes opened on their first call (`on_demand.OneAtATime`) are open one at a time.
    `reference`, a greedy function of the same form, replaces the step model's
    (`keras_greedy`) as what the runtimes must match (a keras_hub CausalLM's own
    generation), named `reference_name` in the report; `window`, the decoder's widest
    sliding window (`description.widest_window`), adds the case past it; `decoder`, the description
    (or `on_demand.DescriptionOnDemand`: made only where the float64 decode is run),
    enables the float64 decode (`exact.py`) that judges router ties and a reference less
    exact than the file (`judge.py`). `release`, called once every runtime has run every
    case (`on_demand.OneAtATime.close`), closes them before that decode judges the runs
    whose logits alone failed, so that no runtime's copy of the weights is held beside it.
    """
    from keras_posenc.export.decoder import judge
    from keras_posenc.export.decoder.greedy_generation import keras_greedy
    from keras_posenc.export.decoder.on_demand import on_demand

    if reference is None:
        reference = lambda prompts, mask, steps: keras_greedy(step_model, prompts, mask, steps)  # noqa: E731
    source = None if decoder is None else on_demand(decoder)
    if source is not None and source.moe:  # every case's router is judged: made once
        progress.phase("describing the model again for the float64 decode of its router")
        source = on_demand(source.describe())
    cases = decoder_cases(vocabulary, max_length, window=window)
    cases.append(teacher_forced_case(vocabulary, max_length))
    expected = [reference(c["prompts"], c["mask"], c["steps"]) for c in cases]
    exacts = [
        _exact(source, case, want, f"case {i + 1} of {len(cases)}")
        for i, (case, want) in enumerate(zip(cases, expected, strict=True))
    ]
    releases = [
        judge.router_releases(exact()[1], c["mask"], c["steps"]) if exact and source.moe else None
        for c, exact in zip(cases, exacts, strict=True)
    ]
    results, failed = [{} for _ in cases], {}
    for name, run in runtimes.items():
        for index, case in enumerate(cases):
            released = None if releases[index] is None else releases[index][0]
            results[index][name], got = _compared(case, expected[index], run, released)
            if got is not None and exacts[index] is not None:
                failed.setdefault(index, []).append((name, got))
    if release is not None:
        release()  # each runtime holds the weights once: none open while the judge runs
    _judge_logits(cases, expected, exacts, releases, results, failed)
    return _report(cases, results, releases, reference_name)


def _report(cases: list[dict], results: list[dict], releases: list, reference_name: str) -> dict:
    """`verify_decoder`'s report of `results` (per case, runtime -> result) and the router
    ties of `releases` (`judge.router_releases`' per case, or None)."""
    report = {
        "tolerance": {"atol": ATOL, "rtol": RTOL},
        "reference": reference_name,
        "cases": [],
        "ties": [],
    }
    for case, found, router in zip(cases, results, releases, strict=True):
        if router is not None:
            report["ties"] += [{"case": case["name"], "runtime": "all", **t} for t in router[1]]
        for name, result in found.items():
            report["ties"] += [{"case": case["name"], "runtime": name, **t} for t in result["ties"]]
        prompts, steps = case["prompts"], case["steps"]
        last = prompts.shape[1] + steps - 1
        report["cases"].append(
            {
                "name": case["name"],
                "batch": len(prompts),
                "steps": steps,
                "positions": [0, last],
                "last_position": last,
                "runtimes": found,
            }
        )
    report["passed"] = failure_message(report) is None
    return report


def _exact(source, case: dict, expected, case_name: str):
    """A thunk of `exact.exact_greedy` along the reference's path of `case` (None without a
    description), computed at its first call and kept; the description is made for it
    (`source.describe()`, its layers said under the judge's name, `case_name`'s) and
    released when it returns."""
    from keras_posenc.export.decoder.exact import exact_greedy

    if source is None:
        return None
    cached = []

    def exact():
        if not cached:
            if not source.moe:  # (a mixture of experts' was made once, and said)
                progress.phase(f"describing the model again for the float64 judge of {case_name}")
            decoder = source.describe()
            progress.phase(f"the float64 decode of {case_name}")
            cached.append(exact_greedy(decoder, case["prompts"], case["mask"], expected[0]))
        return cached[0]

    return exact
