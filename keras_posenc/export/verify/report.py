"""What a verification reports: the report itself, and the bytes of an export."""

from __future__ import annotations

import math
import os
from pathlib import Path

import keras
import numpy as np

from keras_posenc.backend import tensorflow as tf_backend
from keras_posenc.export.onnx_export import onnx_constant_bytes
from keras_posenc.export.signature import export_bound
from keras_posenc.export.verify.coverage import as_ranges

# The report's keys for the artifacts' paths, by runtime.
PATH_KEYS = {"saved_model": "saved_model", "onnxruntime": "onnx", "litert": "litert"}


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
    split tables when it is within the cache, else only the coarse rows below it. The
    tables are those the layers list (`verify.tables.layer_tables`: `position_tables()`,
    the axes' tables of a multi-axis layer, both tables of a switch by length).
    """
    from keras_posenc.export.verify.tables import layer_tables

    bound = export_bound(model, max_sequence_length)
    tables = {}
    for layer in tf_backend.all_layers(model):
        for _, table in layer_tables(layer):
            tables[id(table)] = table
    return sum(
        array.nbytes for table in tables.values() for array in table.stored_arrays(bound).values()
    )


def saved_model_constant_bytes(path: str | os.PathLike) -> int:
    """Bytes of the data a SavedModel stores: its variables and every constant of its graphs.

    A constant used by several functions is counted once per copy in the file, so this is
    what the SavedModel holds, not what the model needs.
    """
    import tensorflow as tf

    path = Path(path)
    proto = tf_backend.saved_model_proto(path)
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
    schema = tf_backend.tflite_schema()
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


def artifact_sizes(model: keras.Model, paths: dict[str, Path], longest: int | None) -> dict:
    """The report's `sizes`: the model's weights and tables, and each artifact's bytes."""
    sizes = {
        "parameter_bytes": parameter_bytes(model),
        "position_table_bytes": position_table_bytes(model, longest),
    }
    if "saved_model" in paths:
        sizes["saved_model_bytes"] = sum(
            p.stat().st_size for p in paths["saved_model"].rglob("*") if p.is_file()
        )
        sizes["saved_model_constant_bytes"] = saved_model_constant_bytes(paths["saved_model"])
    if "onnxruntime" in paths:
        sizes["onnx_constant_bytes"] = onnx_constant_bytes(paths["onnxruntime"])
        sizes["onnx_bytes"] = paths["onnxruntime"].stat().st_size
    if "litert" in paths:
        sizes["litert_bytes"] = paths["litert"].stat().st_size
        sizes["litert_constant_bytes"] = litert_constant_bytes(paths["litert"])
    return sizes


def covered_report(limit: int, kinds: dict, covered: list, covered_axes: dict) -> dict:
    """The report's `positions`: the limit, the position inputs, the positions covered as
    `[first, last]` runs and, per multi-axis input, the runs of each axis."""
    positions = {"limit": limit, "inputs": kinds, "covered": as_ranges(np.concatenate(covered))}
    if covered_axes:
        positions["covered_per_axis"] = {
            name: [as_ranges(np.concatenate(axis)) for axis in zip(*parts, strict=True)]
            for name, parts in covered_axes.items()
        }
    return positions


def case_name(case: dict) -> str:
    """`batch 2 x sequence 17[ from 4080]`: a case as the failure message names it."""
    where = f" from {case['start_index']}" if "start_index" in case else ""
    return f"batch {case['batch']} x sequence {case['sequence']}{where}"


def progress_line(case: dict, compared) -> str:
    """One line for `progress`: the case, its largest absolute error, pass or FAIL."""
    worst = max(case["runtimes"][name]["max_abs_error"] for name in compared)
    where = f" from {case['start_index']:>8}" if "start_index" in case else ""
    return (
        f"batch {case['batch']:>2} x sequence {case['sequence']:>4}{where}: "
        f"max abs error {worst:.1e}, {'pass' if case['passed'] else 'FAIL'}"
    )


def failure_message(model_name: str, report: dict, compared, report_path) -> str:
    """What `VerificationError` says: the runtimes and the first cases that failed."""
    from keras_posenc.export.verify.tables import failed_tables

    cases = report["cases"]
    failed = [case_name(c) for c in cases if not c["passed"]]
    tables = failed_tables(report.get("tables", {}))
    see = str(report_path) if report_path is not None else "the error's report"
    if not failed:
        return (
            f"The export of {model_name!r} stores position tables that differ from Keras: "
            f"{'; '.join(tables[:3])}{'; ...' if len(tables) > 3 else ''}; see {see}"
        )
    runtimes_failed = [n for n in compared if not report["summary"][n]["passed"]]
    also = f"; and its tables: {'; '.join(tables[:3])}" if tables else ""
    return (
        f"The export of {model_name!r} differs from Keras beyond {report['tolerance']} in "
        f"{', '.join(runtimes_failed)} on {len(failed)} of {len(cases)} cases "
        f"({', '.join(failed[:3])}{', ...' if len(failed) > 3 else ''}){also}; see {see}"
    )
