"""Where the reference's own answer is only right up to rounding: ties and the reference's error.

Three rules on top of `check.compare_greedy`:

- **Argmax ties.** Where the reference's top-1 logit leads its top-2 by no more than
  twice the row's tolerance (each of the two may move by one tolerance in a float32
  computation as right as the reference's), either token is right. The runtime is then
  fed the reference's token and goes on along the reference's path (`follow`: the
  prompt and the reference's tokens so far run again as one prompt, the steps after it
  as before), and the tie is reported (case, step, row, position, margin). A different
  token where the reference's margin is wider fails.
- **Router ties** (a mixture of experts). Where a token's `top_k`-th router logit leads
  the next by no more than twice the router row's tolerance, in the float64 decode of
  the description (`exact.py`), float32 computations may pick different experts, and the
  row's logits from that position on (its later tokens read that token's keys) differ by
  what the experts differ: each row is compared up to its first router tie, and the tie
  is reported.
- **The reference's own error.** A reference computed in float32 less exactly than the
  file (keras_hub forms RoPE angles in float32) may be farther from the exact logits than
  the file's tolerance. Where a runtime's logits fail against the reference, they are
  held to a float64 decode of the description (`against_float64`): the runtime passes
  when it is within tolerance of it, the reference farther from it than the runtime,
  and the reference within `REFERENCE_SLACK` tolerances of it (farther than that is not
  rounding: the description and the reference disagree). Both distances are reported.
"""

from __future__ import annotations

import numpy as np

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

REFERENCE_SLACK = 10  # tolerances a float32 reference may be from the float64 decode


def _position(at, step: int, row: int) -> int:
    return int(at[0][row, -1] if step == 0 else at[step][row])


def follow(run, expected, prompts: np.ndarray, mask: np.ndarray, steps: int, released=None):
    """`((tokens, logits), ties)`: greedy `run` (`(prompts, mask, steps) -> (tokens,
    logits)`), fed the reference's token wherever its own differs at a tie (or in a row
    `released` at that position: a router tie), as if it had chosen it. Stops at the
    first different token that is not a tie, left for `compare_greedy` to report."""
    ref_tokens, ref_logits = expected
    batch = len(prompts)
    released = np.full(batch, np.inf) if released is None else released
    at = positions(mask, steps)
    tokens, logits = run(prompts, mask, steps)
    ties = []
    while True:
        differ = tokens != ref_tokens
        if not differ.any():
            break
        step = int(np.argwhere(differ)[:, 1].min())
        for row in np.nonzero(differ[:, step])[0]:
            position = _position(at, step, row)
            if position >= released[row]:
                continue  # a router tie before it, reported with the case
            want = ref_logits[0][row, -1] if step == 0 else ref_logits[step][row]
            gap, allowed = float(margin(want)), float(TIE * bound(want)[0])
            if gap > allowed:
                return (tokens, logits), ties
            tie = {"kind": "argmax", "step": step, "row": int(row), "position": position}
            ties.append({**tie, "margin": gap, "bound": allowed})
        tokens = tokens.copy()
        tokens[:, step] = ref_tokens[:, step]
        if step == steps:
            break
        forced = np.concatenate([prompts, ref_tokens[:, : step + 1].astype(prompts.dtype)], 1)
        forced_mask = np.concatenate([mask, np.ones((batch, step + 1), mask.dtype)], 1)
        after, more = run(forced, forced_mask, steps - step - 1)
        tokens = np.concatenate([tokens[:, : step + 1], after], 1)
        logits = [*logits[: step + 1], more[0][:, -1], *more[1:]]
    return (tokens, logits), ties


def router_releases(
    router, mask: np.ndarray, steps: int, rtol: float = RTOL
) -> tuple[np.ndarray, list[dict]]:
    """`(released (batch,), ties)`: each row's first position whose router is tied within
    rounding (`exact.exact_greedy`'s `(gap, scale)`, greedy layout: a gap within `TIE ·
    (ATOL + rtol · scale)`), `inf` where none. `rtol` larger than float32's: a quantized
    file's int8 activations (`quantized_routers.py`)."""
    gaps, scales = router
    at = positions(mask, steps)
    released = np.full(len(mask), np.inf)
    ties = []
    for row in range(len(mask)):
        found = []  # (position, step, gap, allowed) of each tied row
        for step in range(steps + 1):
            where = np.atleast_1d(at[step][row])
            gap = np.atleast_1d(gaps[step][row])
            allowed = TIE * (ATOL + rtol * np.atleast_1d(scales[step][row]))
            for i in np.nonzero((gap <= allowed) & (where >= 0))[0]:
                found.append((int(where[i]), step, float(gap[i]), float(allowed[i])))
        if found:
            position, step, gap, allowed = min(found)
            released[row] = position
            tie = {"kind": "router", "step": int(step), "row": row, "position": int(position)}
            ties.append({**tie, "margin": gap, "bound": allowed})
    return released, ties


def _distance(logits, exact, selected, last: int) -> dict:
    """The largest |logit - exact| over the compared rows of steps `0..last`, and the
    largest in tolerances (`ATOL + RTOL·rms(exact row)`); `BLOCK_LOGITS` values at a
    time (a teacher-forced prompt of 1024 rows of a vocabulary of 128256 is 1 GB in
    float64, each array its errors take)."""
    worst_abs = worst = 0.0
    for step in range(last + 1):
        rows = np.nonzero(selected[step])  # no copy of the selected rows: a block at a time
        block = max(1, BLOCK_LOGITS // exact[step].shape[-1])
        for i in range(0, len(rows[0]), block):
            index = tuple(axis[i : i + block] for axis in rows)
            got, want = np.asarray(logits[step][index], np.float64), exact[step][index]
            error = np.abs(got - want)
            error = np.where(np.isnan(error), np.inf, error)
            worst_abs = max(worst_abs, float(error.max()))
            worst = max(worst, float((error / bound(want)).max()))
    return {"max_abs_error": worst_abs, "tolerances": worst}


def against_float64(expected, got, exact, mask: np.ndarray, last: int, released=None) -> dict:
    """The runtime's and the reference's distances from the float64 decode `exact` (greedy
    layout) over the rows `compare_greedy` compares, steps `0..last`, and the verdict of
    the module docstring (`"passed"`, `"cause"`)."""
    steps = len(exact) - 1
    selected = compared(mask, steps, released)
    runtime = _distance(got[1], exact, selected, last)
    reference = _distance(expected[1], exact, selected, last)
    if runtime["tolerances"] > 1:
        cause = "the file is off the float64 decode too"
    elif reference["tolerances"] > REFERENCE_SLACK:
        cause = (
            f"the reference is over {REFERENCE_SLACK} tolerances from the float64 decode of "
            "the description: they disagree by more than rounding"
        )
    elif reference["max_abs_error"] <= runtime["max_abs_error"]:
        cause = "the reference is no farther from the float64 decode than the file"
    else:
        cause = None
    return {"file": runtime, "reference": reference, "passed": cause is None, "cause": cause}
