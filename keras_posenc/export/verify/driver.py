"""Verification: Keras and every exported runtime on the same inputs, compared.

`verify_export` is five steps, each a function here: the artifacts (`artifact_paths`), the
reference and the cases (`plan`), each case run on every runtime and compared
(`run_cases`, one `run_case` each), the audit of the stored tables (`tables.audit_tables`),
and the report (`assemble_report`), written and raised on. What is run is
`coverage`; the runners, `runtimes`; how outputs are compared, `compare`; the sizes and
the lines of the report, `report`; the audit of every stored table row, `tables`.
"""

from __future__ import annotations

import dataclasses
import errno
import os
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path

import keras
import numpy as np
import tensorflow as tf

from keras_posenc.export.backend import requires_tensorflow
from keras_posenc.export.errors import VerificationError
from keras_posenc.export.files import is_saved_model, recover_interrupted, write_json
from keras_posenc.export.precision import (
    compute_dtypes,
    exportable_model,
    float32_copy,
    is_low_precision,
)
from keras_posenc.export.signature import serving_function
from keras_posenc.export.verify.compare import (
    FLOAT16_TOLERANCE,
    FLOAT32_TOLERANCE,
    compare_outputs,
    runtime_failure,
    summarize,
)
from keras_posenc.export.verify.coverage import (
    BATCH_SIZES,
    SEQUENCE_LENGTHS,
    covered_coordinates,
    covered_positions,
    default_inputs,
    longest_sequence,
    position_inputs,
    position_limit,
    verification_cases,
)
from keras_posenc.export.verify.report import (
    PATH_KEYS,
    artifact_sizes,
    covered_report,
    failure_message,
    progress_line,
)
from keras_posenc.export.verify.runtimes import Runtimes, as_numpy, median_latencies
from keras_posenc.export.verify.tables import audit_tables, unaudited_tables


def artifact_paths(saved_model_path, onnx_path, litert_path) -> dict[str, Path]:
    """`{runtime: path}` for the artifacts given, each checked to exist (after recovery)."""
    given = {"saved_model": saved_model_path, "onnxruntime": onnx_path, "litert": litert_path}
    paths = {name: Path(path) for name, path in given.items() if path is not None}
    if not paths:
        raise ValueError(
            "Nothing to verify: give saved_model_path, onnx_path or litert_path (or several)."
        )
    for name, path in paths.items():
        recover_interrupted(path)  # an artifact a killed export left aside is put back
        if name == "saved_model" and not is_saved_model(path):
            raise FileNotFoundError(
                errno.ENOENT,
                f"No SavedModel at {str(path)!r}; write one with save_saved_model",
                str(path),
            )
        if name == "onnxruntime" and not path.is_file():
            raise FileNotFoundError(
                errno.ENOENT, f"No ONNX file at {str(path)!r}; write one with save_onnx", str(path)
            )
        if name == "litert" and not path.is_file():
            raise FileNotFoundError(
                errno.ENOENT,
                f"No LiteRT file at {str(path)!r}; write one with save_litert",
                str(path),
            )
    return paths


def verify_export(
    model: keras.Model,
    saved_model_path: str | os.PathLike | None = None,
    onnx_path: str | os.PathLike | None = None,
    *,
    litert_path: str | os.PathLike | None = None,
    batch_sizes: Sequence[int] = BATCH_SIZES,
    sequence_lengths: Sequence[int] = SEQUENCE_LENGTHS,
    max_sequence_length: int | None = None,
    make_inputs: Callable[[int, int], dict[str, np.ndarray]] | None = None,
    repeats: int = 5,
    timed_shapes: Sequence[tuple[int, int]] | None = None,
    report_path: str | os.PathLike | None = None,
    progress: Callable[[str], None] | None = None,
    raise_on_failure: bool = True,
) -> dict:
    """Runs Keras and each artifact given on the same inputs and compares them.

    Runtimes: the reloaded SavedModel (TensorFlow), onnxruntime and LiteRT, for each
    artifact given. Cases (`coverage.verification_cases`): the shapes the model accepts,
    none a traced one, with starts and positions that reach every position table near
    its first and last rows (the report lists the positions covered). float32 passes at
    `allclose(atol=1e-5, rtol=1e-4)` against Keras; a float16 model's runtimes, Keras
    included, are compared with its float32 twin at `atol=rtol=1e-2`; a bfloat16 model is
    checked as its exported float32 copy (see `exportable_model`). Latency: the median of
    `repeats` interleaved calls per runtime after a warm-up (the call compared).

    Example:

    ```python
    report = verify_export(model, "out/saved_model", "out/model.onnx", batch_sizes=(1, 2))
    report["summary"]["onnxruntime"]["max_abs_error"]  # below 1e-5, or it raised
    ```

    Args:
        model: the Keras model that was exported.
        saved_model_path: the SavedModel folder `save_saved_model` wrote.
        onnx_path: the ONNX file `save_onnx` wrote.
        litert_path: the `.tflite` file `save_litert` wrote.
        batch_sizes: batch sizes to check (positive integers).
        sequence_lengths: sequence lengths to check (positive integers; those past the
            longest are left out).
        max_sequence_length: the largest position + 1 the files serve, as given to the
            export functions, and checked up to it (default: the smallest learned table, if any).
        make_inputs: `make_inputs(batch, sequence)` returns `{input name: array}`;
            default `coverage.default_inputs` (with the starts described above).
        repeats: timed calls per runtime and timed case.
        timed_shapes: `(batch, sequence)` pairs to time (the first case of each); the
            others are run once, compared, and get `latency_ms` None. Default: every case.
        report_path: where to write the report as JSON (whole or not at all), if given.
        progress: called with a line of text after each case.
        raise_on_failure: raise `VerificationError` (after writing the report) on failure.

    Returns:
        The report (`assemble_report` says what each key holds): `passed`, `cases` and
        `summary` (each runtime's errors per case, and the largest), `positions`, `sizes`,
        `tolerance`, `notes`, `tables` (the audit of every stored position table).

    Raises:
        ValueError: batch sizes or sequence lengths that are not positive integers.
        VerificationError: a runtime differs from Keras beyond the tolerance (with
            `raise_on_failure`); the report is written first.
    """
    requires_tensorflow("verify_export")  # before anything is written
    paths = artifact_paths(saved_model_path, onnx_path, litert_path)
    checked_options(repeats, max_sequence_length)
    planned = plan(model, batch_sizes, sequence_lengths, max_sequence_length, make_inputs)
    runtimes = Runtimes(planned.model, paths)
    compared = runtimes.names if planned.twin is not None else runtimes.names[1:]
    started = time.perf_counter()
    cases, covered = run_cases(planned, runtimes, compared, repeats, timed_shapes, progress)
    audits = audit_tables(planned.model, paths, planned.bound)
    report = assemble_report(
        model, planned, runtimes, compared, paths, cases, covered, audits, repeats, started
    )
    if report_path is not None:
        write_json(report, report_path)
    if raise_on_failure and not report["passed"]:
        raise VerificationError(failure_message(model.name, report, compared, report_path), report)
    return report


def checked_options(repeats, max_sequence_length) -> None:
    """Refuses a `repeats` or `max_sequence_length` that is not a positive integer."""
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats must be a positive integer, got {repeats!r}.")
    if max_sequence_length is not None and (
        isinstance(max_sequence_length, bool)
        or not isinstance(max_sequence_length, (int, np.integer))
        or max_sequence_length < 1
    ):
        raise ValueError(
            f"max_sequence_length must be a positive integer or None, got {max_sequence_length!r}."
        )


@dataclasses.dataclass
class Plan:
    """What a verification compares with and runs.

    `model` is the model as exported (the float32 copy of a bfloat16 one); `twin`, for a
    float16 model, the serving function of its float32 twin, which every runtime (Keras
    included) is compared with; `cases` the `coverage.verification_cases` (or the shapes
    alone, with the caller's `make_inputs`) and `feeds_for(case)` their inputs.
    """

    model: keras.Model
    notes: list[str]
    tolerance: dict
    twin: Callable | None
    longest: int | None
    bound: int | None
    cases: list[dict]
    feeds_for: Callable[[dict], dict[str, np.ndarray]]


def plan(model, batch_sizes, sequence_lengths, max_sequence_length, make_inputs) -> Plan:
    """The reference, the tolerance and the cases of a verification of `model`."""
    with warnings.catch_warnings():  # it was said when the model was exported
        warnings.simplefilter("ignore")
        exported, notes = exportable_model(model, "float32")
    low_precision = any(is_low_precision(d) for d in compute_dtypes(exported))
    twin = serving_function(float32_copy(exported)) if low_precision else None
    if low_precision:
        notes.append(
            "float16 model: each runtime, Keras included, is compared with its float32 twin."
        )
    # The longest sequence (a learned table, a cache's slots) bounds the steps of a case;
    # only the export's bound (or a learned table) bounds the positions: a cache's slots
    # are not positions, so a positions input still probes the whole table.
    longest = max_sequence_length or longest_sequence(model)
    bound = max_sequence_length
    cases = verification_cases(exported, batch_sizes, sequence_lengths, bound)
    if make_inputs is not None:  # the caller chooses starts and positions
        shapes = dict.fromkeys((c["batch"], c["sequence"]) for c in cases)
        cases = [{"batch": b, "sequence": s} for b, s in shapes]

        def feeds_for(case: dict) -> dict[str, np.ndarray]:
            return make_inputs(case["batch"], case["sequence"])

    else:

        def feeds_for(case: dict) -> dict[str, np.ndarray]:
            return default_inputs(
                exported,
                case["batch"],
                case["sequence"],
                bound,
                start_index=case.get("start_index"),
                probe_offset=case.get("probe_offset", 0),
            )

    tolerance = FLOAT16_TOLERANCE if low_precision else FLOAT32_TOLERANCE
    return Plan(exported, notes, tolerance, twin, longest, bound, cases, feeds_for)


def run_cases(
    planned: Plan,
    runtimes: Runtimes,
    compared: list[str],
    repeats: int,
    timed_shapes: Sequence[tuple[int, int]] | None,
    progress: Callable[[str], None] | None,
) -> tuple[list[dict], tuple[list, dict]]:
    """Every planned case run (`run_case`), timed where `timed_shapes` says, and reported to
    `progress`; with the positions each covered (`assemble_report`'s `covered`)."""
    cases, covered, covered_axes = [], [], {}
    to_time = None if timed_shapes is None else {tuple(shape) for shape in timed_shapes}
    for shape in planned.cases:
        feeds = planned.feeds_for(shape)
        covered.append(covered_positions(planned.model, feeds, shape["sequence"]))
        for name, per_axis in covered_coordinates(planned.model, feeds).items():
            covered_axes.setdefault(name, []).append(per_axis)
        key = (shape["batch"], shape["sequence"])
        timed = to_time is None or key in to_time
        if to_time is not None:
            to_time.discard(key)  # the first case of each timed shape
        cases.append(run_case(planned, runtimes, compared, shape, feeds, repeats if timed else 0))
        if progress is not None:
            progress(progress_line(cases[-1], compared))
    return cases, (covered, covered_axes)


def run_outputs(calls: dict[str, Callable[[], dict]]) -> dict[str, dict]:
    """Each runtime's outputs (this is also the warm-up), or `{"error": ...}` where it raised.

    A runtime that fails on a case fails that case; Keras failing is the caller's error.
    """
    outputs = {}
    for name, call in calls.items():
        try:
            outputs[name] = as_numpy(call())
        except Exception as error:
            if name == "keras":
                raise
            outputs[name] = {"error": f"{type(error).__name__}: {str(error)[:300]}"}
    return outputs


def run_case(
    planned: Plan, runtimes: Runtimes, compared: list[str], shape: dict, feeds: dict, repeats: int
) -> dict:
    """One case: every runtime run on `feeds`, timed, and compared with the reference.

    Returns the case (`shape` without its `probe_offset`) with, per runtime, its errors
    (for those compared), `passed` and `latency_ms` (None with `repeats=0`: not timed);
    and whether all compared passed.
    """
    calls = runtimes.calls(feeds)
    outputs = run_outputs(calls)
    if planned.twin is not None:
        specs = runtimes.runners["keras"].specs
        reference = as_numpy(planned.twin(*(tf.constant(feeds[spec.name]) for spec in specs)))
    else:
        reference = outputs["keras"]
    working = {n: c for n, c in calls.items() if "error" not in outputs[n]}
    latencies = median_latencies(working, repeats) if repeats else {}
    case = {k: v for k, v in shape.items() if k != "probe_offset"}
    case["runtimes"] = {}
    for name in runtimes.names:
        if "error" in outputs[name]:
            entry = runtime_failure(outputs[name]["error"])
        elif name in compared:
            entry = compare_outputs(outputs[name], reference, planned.tolerance)
        else:
            entry = {}
        case["runtimes"][name] = {**entry, "latency_ms": latencies.get(name)}
    case["passed"] = all(case["runtimes"][name]["passed"] for name in compared)
    return case


def assemble_report(
    model, planned: Plan, runtimes, compared, paths, cases, covered, audits, repeats, started
) -> dict:
    """The report of `verify_export`.

    It holds `passed`; `cases`, per case each runtime's `max_abs_error`,
    `max_rel_error`, `passed` and `latency_ms`; `summary`, per runtime the largest
    errors over all cases; `positions` (the limit, the position inputs, and the
    positions covered as `[first, last]` runs; with several axes also
    `covered_per_axis`, `{input: [runs of axis 0, ...]}`); `sizes` (bytes of the
    artifacts, of the model's weights and of its position tables); `tolerance`; `notes`;
    `tables`, per runtime the audit of every stored position table against the one
    the model holds (`verify.tables`: every row, exactly; `passed` false when any
    stored row differs, the entry naming the table and its worst row; a table not
    stored whole is listed in its `not_stored_whole` and in `notes`).

    `covered` is `(positions per case, {multi-axis input: [coordinates per case]})`,
    `audits` the `tables.audit_tables` of the artifacts.
    """
    low_precision = planned.twin is not None
    limit = position_limit(planned.model, planned.bound)
    return {
        "model": model.name,
        "passed": all(case["passed"] for case in cases)
        and all(audit["passed"] for audit in audits.values()),
        **{PATH_KEYS[name]: str(path) for name, path in paths.items()},
        "runtimes": runtimes.names,
        "reference": "keras float32 twin" if low_precision else "keras",
        "tolerance": planned.tolerance,
        "relative_error": "max |runtime - reference| / |reference| over nonzero references",
        "tolerance_used": "max |runtime - reference| / (atol + rtol |reference|); pass <= 1",
        "longest_sequence": planned.longest,
        "positions": covered_report(limit, position_inputs(planned.model), *covered),
        "repeats": repeats,
        "seconds": round(time.perf_counter() - started, 2),
        "notes": planned.notes + unaudited_tables(audits),
        "sizes": artifact_sizes(planned.model, paths, planned.bound),
        "summary": summarize(cases, runtimes.names, compared),
        "cases": cases,
        "tables": audits,
    }
