"""What a verification reports: errors against the reference, and the bytes of an export."""

from __future__ import annotations

import math
from collections.abc import Sequence

import keras
import numpy as np

from keras_posenc.export.signature import _all_layers

FLOAT32_TOLERANCE = {"atol": 1e-5, "rtol": 1e-4}
FLOAT16_TOLERANCE = {"atol": 1e-2, "rtol": 1e-2}


def parameter_bytes(model: keras.Model) -> int:
    """Bytes of the model's weights (trainable and not)."""
    return sum(
        math.prod(v.shape) * np.dtype(keras.backend.standardize_dtype(v.dtype)).itemsize
        for v in model.weights
    )


def position_table_bytes(model: keras.Model) -> int:
    """Bytes of the host position tables the model's layers turn into graph constants.

    Each distinct table counts once: its cached rows and the two-table split that serves
    positions past the cache (see `keras_posenc.frequencies`).
    """
    tables = {}
    for layer in _all_layers(model):
        table = getattr(layer, "_table", None)
        if table is not None and hasattr(table, "cached"):
            tables[id(table)] = table
    total = 0
    for table in tables.values():
        total += sum(array.nbytes for array in table.cached)
        total += sum(t.array.nbytes for t in table.frequencies._split_tables)
    return total


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
