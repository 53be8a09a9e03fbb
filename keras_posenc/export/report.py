"""What a verification reports: errors against the reference, and the bytes of an export."""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from pathlib import Path

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


def position_table_bytes(model: keras.Model, max_sequence_length: int | None = None) -> int:
    """Bytes of the host position tables the model's layers turn into graph constants.

    Each distinct table counts once: its cached rows and the two-table split that serves
    positions past the cache (see `keras_posenc.frequencies`). With a bound (an export's
    `max_sequence_length`, else the smallest learned table) only the rows below it: no
    split tables when it is within the cache, else only the coarse rows below it.
    """
    from keras_posenc.export.signature import export_bound
    from keras_posenc.frequencies import CACHED_POSITIONS

    bound = export_bound(model, max_sequence_length)
    tables = {}
    for layer in _all_layers(model):
        table = getattr(layer, "_table", None)
        if table is not None and hasattr(table, "cached"):
            tables[id(table)] = table
    total = 0
    for table in tables.values():
        cached = table.cached
        if bound is not None and bound <= CACHED_POSITIONS:
            total += sum(array[:bound].nbytes for array in cached)
            continue
        total += sum(array.nbytes for array in cached)
        fine_sin, fine_cos, coarse_sin, coarse_cos = table.frequencies._split_tables
        coarse_rows = None if bound is None else -(-bound // CACHED_POSITIONS)
        total += fine_sin.array.nbytes + fine_cos.array.nbytes
        total += sum(t.array[:coarse_rows].nbytes for t in (coarse_sin, coarse_cos))
    return total


def saved_model_constant_bytes(path: str | os.PathLike) -> int:
    """Bytes of the data a SavedModel stores: its variables and every constant of its graphs.

    A constant used by several functions is counted once per copy in the file, so this is
    what the SavedModel holds, not what the model needs.
    """
    import tensorflow as tf
    from tensorflow.core.protobuf import saved_model_pb2

    path = Path(path)
    proto = saved_model_pb2.SavedModel()
    proto.ParseFromString((path / "saved_model.pb").read_bytes())
    total = sum(p.stat().st_size for p in (path / "variables").glob("variables.data-*"))
    for graph in proto.meta_graphs:
        functions = [graph.graph_def.node, *(f.node_def for f in graph.graph_def.library.function)]
        for nodes in functions:
            for node in nodes:
                if node.op == "Const":
                    total += tf.make_ndarray(node.attr["value"].tensor).nbytes
    return total


def litert_constant_bytes(path_or_content: str | os.PathLike | bytes) -> int:
    """Bytes of the data buffers of a `.tflite` file (its weights and constants)."""
    from tensorflow.lite.python import schema_py_generated as schema

    content = (
        path_or_content
        if isinstance(path_or_content, bytes)
        else Path(path_or_content).read_bytes()
    )
    model = schema.Model.GetRootAsModel(content, 0)
    total = 0
    for index in range(model.BuffersLength()):
        buffer = model.Buffers(index)
        # Files over 2 GiB keep their buffers after the flatbuffer (offset and size).
        total += buffer.DataLength() or buffer.Size()
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
