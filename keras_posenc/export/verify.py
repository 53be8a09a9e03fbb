"""Verification: Keras and every exported runtime on the same inputs, compared.

What is run (shapes, starts, positions) is `keras_posenc.export.coverage`; how outputs are
compared and what the report holds, `keras_posenc.export.report`.
"""

from __future__ import annotations

import errno
import os
import statistics
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from keras_posenc.export.coverage import (
    BATCH_SIZES,
    SEQUENCE_LENGTHS,
    as_ranges,
    covered_coordinates,
    covered_positions,
    default_inputs,
    longest_sequence,
    position_inputs,
    position_limit,
    verification_cases,
)
from keras_posenc.export.errors import VerificationError
from keras_posenc.export.files import is_saved_model, recover_interrupted, write_json
from keras_posenc.export.onnx_export import onnx_constant_bytes
from keras_posenc.export.precision import (
    _is_low_precision,
    compute_dtypes,
    exportable_model,
    float32_copy,
)
from keras_posenc.export.report import (
    FLOAT16_TOLERANCE,
    FLOAT32_TOLERANCE,
    compare_outputs,
    litert_constant_bytes,
    parameter_bytes,
    position_table_bytes,
    saved_model_constant_bytes,
    summarize,
)
from keras_posenc.export.signature import input_signature, serving_function

RUNTIMES = ("keras", "saved_model", "onnxruntime", "litert")


def _median_latencies(calls: dict[str, Callable[[], Any]], repeats: int) -> dict[str, float]:
    """Median milliseconds per call, the calls interleaved so that they share the machine.

    The order rotates from one round to the next: what one call leaves behind (threads
    still awake, caches) falls on each of the others in turn.
    """
    names = list(calls)
    samples = {name: [] for name in names}
    for round_ in range(repeats):
        shift = round_ % len(names)
        for name in names[shift:] + names[:shift]:
            start = time.perf_counter()
            calls[name]()
            samples[name].append(time.perf_counter() - start)
    return {name: round(statistics.median(s) * 1e3, 4) for name, s in samples.items()}


class _Runtimes:
    """Keras and the artifacts given, each called on `{input name: array}`."""

    def __init__(self, model: keras.Model, paths: dict[str, Path]):
        self.specs = input_signature(model)
        # Keras runs the model as a graph traced apart from the exported one but with the
        # same dynamic axes: the same kernels, so the SavedModel's error measures what
        # saving and loading change (a graph traced per shape, or eager execution, picks
        # other kernels and differs from either by ~1e-6 of float32 rounding).
        self.keras = serving_function(model)
        self.names = ["keras", *paths]
        if "saved_model" in paths:
            loaded = tf.saved_model.load(str(paths["saved_model"]))
            self.serve = loaded.signatures["serving_default"]
        if "onnxruntime" in paths:
            import onnxruntime

            options = onnxruntime.SessionOptions()
            options.log_severity_level = 3
            # After a run onnxruntime's threads spin, waiting for the next one; interleaved
            # with TensorFlow they would take its cores and slow whichever call comes next.
            options.add_session_config_entry("session.intra_op.allow_spinning", "0")
            self.session = onnxruntime.InferenceSession(
                str(paths["onnxruntime"]), options, providers=["CPUExecutionProvider"]
            )
            self.onnx_outputs = [o.name for o in self.session.get_outputs()]
        if "litert" in paths:
            from keras_posenc.export.litert import LiteRTRunner

            self.litert = LiteRTRunner(paths["litert"])

    def calls(self, feeds: dict) -> dict[str, Callable[[], dict]]:
        """Per runtime, a call with the inputs already converted, returning `{name: output}`."""
        tensors = {name: tf.constant(value) for name, value in feeds.items()}
        ordered = [tensors[spec.name] for spec in self.specs]
        calls = {"keras": lambda: self.keras(*ordered)}
        if "saved_model" in self.names:
            calls["saved_model"] = lambda: self.serve(**tensors)
        if "onnxruntime" in self.names:
            calls["onnxruntime"] = lambda: dict(
                zip(self.onnx_outputs, self.session.run(None, feeds), strict=True)
            )
        if "litert" in self.names:
            self.litert.prepare(feeds)  # resizing is not part of a call's latency
            calls["litert"] = lambda: self.litert(feeds)
        return calls


def _artifacts(saved_model_path, onnx_path, litert_path) -> dict[str, Path]:
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
    report_path: str | os.PathLike | None = None,
    progress: Callable[[str], None] | None = None,
    raise_on_failure: bool = True,
) -> dict:
    """Runs Keras and each artifact given on the same inputs and compares them.

    Runtimes: the reloaded SavedModel (TensorFlow), onnxruntime, LiteRT, each for the
    artifact given. Cases (`coverage.verification_cases`): the batch sizes and sequence
    lengths the model accepts (its fixed axes at their sizes; otherwise every batch size
    with every length up to the longest, `max_sequence_length` or the smallest learned
    table), and for a `start_index` or `positions` input, starts and positions that reach
    each position table near its first and its last rows (up to the largest position
    the model allows); the report lists the positions covered. No case is a traced shape:
    the artifacts were traced with dynamic axes. A float32 model passes when each
    runtime meets `allclose(atol=1e-5, rtol=1e-4)` against Keras; the runtimes of a
    float16 model, Keras included, are compared with its float32 twin at
    `atol=rtol=1e-2`. A bfloat16 model is checked as the float32 copy that was exported
    (see `exportable_model`). Latency is the median of `repeats` calls per runtime,
    interleaved, after a warm-up.

    Example:

    ```python
    report = verify_export(
        model, "out/saved_model", "out/model.onnx", batch_sizes=(1, 2), sequence_lengths=(3, 17)
    )
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
            export functions: lengths, starts and positions up to it are checked, none
            past it (default: the smallest learned table, else no bound).
        make_inputs: `make_inputs(batch, sequence)` returns `{input name: array}`;
            default `coverage.default_inputs` (with the starts described above).
        repeats: timed calls per runtime and case.
        report_path: where to write the report as JSON (whole or not at all), if given.
        progress: called with a line of text after each case.
        raise_on_failure: raise `VerificationError` (after writing the report) on failure.

    Returns:
        The report: `passed`; `cases`, per case each runtime's `max_abs_error`,
        `max_rel_error`, `passed` and `latency_ms`; `summary`, per runtime the largest
        errors over all cases; `positions` (the limit, the position inputs, and the
        positions covered as `[first, last]` runs; with several axes also
        `covered_per_axis`, `{input: [runs of axis 0, ...]}`); `sizes` (bytes of the
        artifacts, of the model's weights and of its position tables); `tolerance`; `notes`.

    Raises:
        ValueError: batch sizes or sequence lengths that are not positive integers.
        VerificationError: a runtime differs from Keras beyond the tolerance (with
            `raise_on_failure`); the report is written first.
    """
    paths = _artifacts(saved_model_path, onnx_path, litert_path)
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

    with warnings.catch_warnings():  # it was said when the model was exported
        warnings.simplefilter("ignore")
        exported, notes = exportable_model(model, "float32")
    low_precision = any(_is_low_precision(d) for d in compute_dtypes(exported))
    tolerance = FLOAT16_TOLERANCE if low_precision else FLOAT32_TOLERANCE
    twin = serving_function(float32_copy(exported)) if low_precision else None
    if low_precision:
        notes.append(
            "float16 model: each runtime, Keras included, is compared with its float32 twin."
        )
    longest = max_sequence_length or longest_sequence(model)
    cases_to_run = verification_cases(exported, batch_sizes, sequence_lengths, longest)
    if make_inputs is not None:  # the caller chooses starts and positions
        shapes = dict.fromkeys((c["batch"], c["sequence"]) for c in cases_to_run)
        cases_to_run = [{"batch": b, "sequence": s} for b, s in shapes]

        def feeds_for(case: dict) -> dict[str, np.ndarray]:
            return make_inputs(case["batch"], case["sequence"])

    else:

        def feeds_for(case: dict) -> dict[str, np.ndarray]:
            return default_inputs(
                exported,
                case["batch"],
                case["sequence"],
                longest,
                start_index=case.get("start_index"),
                probe_offset=case.get("probe_offset", 0),
            )

    runtimes = _Runtimes(exported, paths)
    compared = runtimes.names if low_precision else runtimes.names[1:]
    started = time.perf_counter()
    cases = []
    covered = []
    covered_axes = {}  # multi-axis positions inputs: {name: [coordinates of each axis]}
    for shape in cases_to_run:
        feeds = feeds_for(shape)
        covered.append(covered_positions(exported, feeds, shape["sequence"]))
        for name, per_axis in covered_coordinates(exported, feeds).items():
            covered_axes.setdefault(name, []).append(per_axis)
        calls = runtimes.calls(feeds)
        outputs = {}
        for name, call in calls.items():  # also the warm-up
            try:
                outputs[name] = _numpy(call())
            except Exception as error:  # a runtime that fails on a case fails that case
                if name == "keras":
                    raise
                outputs[name] = {"error": f"{type(error).__name__}: {str(error)[:300]}"}
        if twin is not None:
            reference = _numpy(twin(*(tf.constant(feeds[spec.name]) for spec in runtimes.specs)))
        else:
            reference = outputs["keras"]
        working = {n: c for n, c in calls.items() if "error" not in outputs[n]}
        latencies = _median_latencies(working, repeats)
        case = {k: v for k, v in shape.items() if k != "probe_offset"}
        case["runtimes"] = {}
        for name in runtimes.names:
            if "error" in outputs[name]:
                entry = {"passed": False, "problems": [outputs[name]["error"]]}
                entry.update(max_abs_error=float("inf"), max_rel_error=float("inf"))
                entry["tolerance_used"] = float("inf")
            elif name in compared:
                entry = compare_outputs(outputs[name], reference, tolerance)
            else:
                entry = {}
            case["runtimes"][name] = {**entry, "latency_ms": latencies.get(name)}
        case["passed"] = all(case["runtimes"][name]["passed"] for name in compared)
        cases.append(case)
        if progress is not None:
            worst = max(case["runtimes"][name]["max_abs_error"] for name in compared)
            where = f" from {shape['start_index']:>8}" if "start_index" in shape else ""
            progress(
                f"batch {shape['batch']:>2} x sequence {shape['sequence']:>4}{where}: "
                f"max abs error {worst:.1e}, {'pass' if case['passed'] else 'FAIL'}"
            )

    kinds = position_inputs(exported)
    report = {
        "model": model.name,
        "passed": all(case["passed"] for case in cases),
        **{
            key: str(paths[name])
            for key, name in (
                ("saved_model", "saved_model"),
                ("onnx", "onnxruntime"),
                ("litert", "litert"),
            )
            if name in paths
        },
        "runtimes": runtimes.names,
        "reference": "keras float32 twin" if low_precision else "keras",
        "tolerance": tolerance,
        "relative_error": "max |runtime - reference| / |reference| over nonzero references",
        "tolerance_used": "max |runtime - reference| / (atol + rtol |reference|); pass <= 1",
        "longest_sequence": longest,
        "positions": {
            "limit": position_limit(exported, longest),
            "inputs": kinds,
            "covered": as_ranges(np.concatenate(covered)),
        },
        "repeats": repeats,
        "seconds": round(time.perf_counter() - started, 2),
        "notes": notes,
        "sizes": _sizes(exported, paths, longest),
        "summary": summarize(cases, runtimes.names, compared),
        "cases": cases,
    }
    if covered_axes:
        report["positions"]["covered_per_axis"] = {
            name: [as_ranges(np.concatenate(axis)) for axis in zip(*parts, strict=True)]
            for name, parts in covered_axes.items()
        }
    if report_path is not None:
        write_json(report, report_path)
    if raise_on_failure and not report["passed"]:
        failed = [_case_name(c) for c in cases if not c["passed"]]
        runtimes_failed = [n for n in compared if not report["summary"][n]["passed"]]
        raise VerificationError(
            f"The export of {model.name!r} differs from Keras beyond {tolerance} in "
            f"{', '.join(runtimes_failed)} on {len(failed)} of {len(cases)} cases "
            f"({', '.join(failed[:3])}{', ...' if len(failed) > 3 else ''}); see "
            + (str(report_path) if report_path is not None else "the error's report"),
            report,
        )
    return report


def _case_name(case: dict) -> str:
    where = f" from {case['start_index']}" if "start_index" in case else ""
    return f"batch {case['batch']} x sequence {case['sequence']}{where}"


def _sizes(model: keras.Model, paths: dict[str, Path], longest: int | None) -> dict[str, int]:
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


def _numpy(outputs: dict) -> dict[str, np.ndarray]:
    return {name: np.asarray(value) for name, value in outputs.items()}
