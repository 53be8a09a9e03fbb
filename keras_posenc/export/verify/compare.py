"""How a runtime's outputs are compared with the reference's: the tolerances and the errors."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

FLOAT32_TOLERANCE = {"atol": 1e-5, "rtol": 1e-4}
FLOAT16_TOLERANCE = {"atol": 1e-2, "rtol": 1e-2}


def compare_outputs(outputs: dict, reference: dict, tolerance: dict) -> dict:
    """How far `outputs` are from `reference`, over all outputs, and whether that passes.

    Returns `max_abs_error`; `max_rel_error`, `|a - b| / |b|` over nonzero references (as
    numpy reports it: large where an output is near zero); `tolerance_used`, the largest
    `|a - b| / (atol + rtol·|b|)`; and `passed`, `allclose(atol, rtol)`, that is
    `tolerance_used <= 1` with no NaN. A missing output or a shape other than the
    reference's fails, with `problems` saying which.
    """
    atol, rtol = tolerance["atol"], tolerance["rtol"]
    result = {"max_abs_error": 0.0, "max_rel_error": 0.0, "tolerance_used": 0.0, "passed": True}
    problems = []
    for name, expected in reference.items():
        if name not in outputs:
            problems.append(f"output {name!r} is missing")
            continue
        actual = np.asarray(outputs[name], np.float64)
        expected = np.asarray(expected, np.float64)
        if actual.shape != expected.shape:
            problems.append(f"output {name!r} has shape {actual.shape}, expected {expected.shape}")
            continue
        difference = np.abs(actual - expected)
        if not np.all(np.isfinite(difference)):
            problems.append(f"output {name!r} has NaN or infinite values (here or in Keras)")
            difference = np.where(np.isfinite(difference), difference, np.inf)
        nonzero = expected != 0
        relative = difference[nonzero] / np.abs(expected[nonzero])
        used = difference / (atol + rtol * np.abs(expected))
        for key, values in (
            ("max_abs_error", difference),
            ("max_rel_error", relative),
            ("tolerance_used", used),
        ):
            result[key] = max(result[key], float(values.max(initial=0.0)))
    result["passed"] = not problems and result["tolerance_used"] <= 1.0
    if problems:
        result["problems"] = problems
    return result


def runtime_failure(error: str) -> dict:
    """The entry of a runtime that raised on a case instead of answering: failed, unbounded."""
    return {
        "passed": False,
        "problems": [error],
        "max_abs_error": float("inf"),
        "max_rel_error": float("inf"),
        "tolerance_used": float("inf"),
    }


def summarize(cases: list[dict], runtimes: Sequence[str], compared: Sequence[str]) -> dict:
    """Per runtime the largest errors over all cases and whether every case passed."""
    summary = {}
    for name in runtimes:
        if name not in compared:
            summary[name] = {"reference": True}
            continue
        entries = [case["runtimes"][name] for case in cases]
        summary[name] = {
            "max_abs_error": max(e["max_abs_error"] for e in entries),
            "max_rel_error": max(e["max_rel_error"] for e in entries),
            "tolerance_used": max(e["tolerance_used"] for e in entries),
            "passed": all(e["passed"] for e in entries),
        }
    return summary
