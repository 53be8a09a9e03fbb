"""The export job, `python -m export`: build or load encoders, export, verify, report.

For each encoder the job writes, whole or not at all,

    <out>/<name>/saved_model/   the SavedModel (signature `serving_default`)
    <out>/<name>/model.onnx     the ONNX model
    <out>/<name>/model.tflite   the LiteRT model (built-in ops only)
    <out>/<name>/report.json    the verification report (see `keras_posenc.export`)

prints a progress line per step and, at the end, a table with one row per encoder and
runtime. The exit status is 0 only when every verification passed; a failed verification
still leaves its artifacts and a report that marks the failure. The arguments come parsed
from `keras_posenc_cli.arguments` (which answers `--help` without importing TensorFlow).
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

# The shapes whose latencies the table shows (those not verified show as "-").
TABLE_SHAPES = ((1, 128), (8, 128))
_ARTIFACT_FILES = ("report.json", "model.onnx", "model.tflite", "saved_model")


@dataclass
class Job:
    """One model to export: its name (artifacts folder), how to get it, its longest sequence."""

    name: str
    load: Callable[[], object]
    longest: int | None
    description: str


def jobs(arguments: argparse.Namespace) -> list[Job]:
    """What to export: the chosen default encoders, or the `--model` file."""
    from keras_posenc_cli import encoders

    if arguments.model is not None:
        path = arguments.model

        def load():
            return load_user_model(path, getattr(arguments, "imports", ()))

        name = re.sub(r"[^A-Za-z0-9_.-]", "_", path.stem)
        return [Job(name, load, arguments.max_length, f"loaded the Keras model {path}")]
    chosen = arguments.encoder or list(encoders.DEFAULT_ENCODERS)
    result = []
    for name in dict.fromkeys(chosen):
        spec = encoders.DEFAULT_ENCODERS[name]
        result.append(
            Job(
                name,
                lambda spec=spec: encoders.build_encoder(spec),
                arguments.max_length or spec.max_sequence_length,
                f"built the {spec.position} encoder: vocabulary {spec.vocabulary_size}, "
                f"width {spec.width}, "
                f"{spec.num_heads} heads, {spec.num_blocks} blocks, feed-forward "
                f"{spec.feed_forward_dim}, longest sequence "
                f"{arguments.max_length or spec.max_sequence_length or 'unbounded'}",
            )
        )
    return result


def load_user_model(path, imports=()):
    """The `.keras` file at `path`, loaded after importing the modules `imports` (those
    that register the model's own layers).

    Raises:
        TypeError: a class of the file is registered by no imported module; the message
            says to pass `--import MODULE`.
    """
    import importlib

    import keras

    from keras_posenc_cli.arguments import user_module_path

    user_module_path()
    for module in imports:
        importlib.import_module(module)
    try:
        return keras.saving.load_model(path)
    except TypeError as error:
        found = re.search(r"Could not locate (class|function) '([^']+)'", str(error))
        if found is None:
            raise
        # Keras's config names the module that defined it (where it was saved).
        module = re.search(r"'module': '([^']+)'", str(error)[found.end() :])
        named = f" (saved from module {module.group(1)!r})" if module else ""
        raise TypeError(
            f"{path} holds the {found.group(1)} {found.group(2)!r}{named}, which Keras "
            "cannot find: import the module that defines and registers it first, with "
            "--import MODULE (its dotted name, from the current folder or the installed "
            "packages; repeat for several)."
        ) from error


def _is_artifacts_folder(folder: Path) -> bool:
    return any((folder / name).exists() for name in _ARTIFACT_FILES)


def export_one(job: Job, arguments: argparse.Namespace, log: Callable[[str], None]) -> dict:
    """Exports and verifies one model into `<out>/<name>/`; returns its report."""
    from keras_posenc import export

    started = time.perf_counter()
    model = job.load()
    log(f"{job.description} ({model.count_params():,} parameters)")
    model, notes = export.exportable_model(model, bfloat16="float32")
    for note in notes:
        log(note)
    with export.whole_or_nothing(
        arguments.out / job.name, replace_if=_is_artifacts_folder
    ) as folder:
        folder.mkdir()
        litert_error = _write_files(model, folder, job.longest, arguments, log)
        report = _verified(model, folder, job.longest, arguments, log, litert_error)
        report.update(
            {
                "model": job.name,
                "description": job.description,
                "opset": arguments.opset,
                "rotary": arguments.rotary,
                "saved_model": "saved_model",
                "onnx": "model.onnx",
                **({"litert_error": litert_error} if litert_error else {"litert": "model.tflite"}),
                "passed": report["passed"] and not litert_error,
                "notes": notes + [n for n in report["notes"] if n not in notes],
            }
        )
        export.write_json(report, folder / "report.json")
    verdict = "passed" if report["passed"] else "FAILED"
    log(
        f"verification {verdict}; {arguments.out / job.name}/ written "
        f"({time.perf_counter() - started:.1f} s)"
    )
    return report


def _write_files(
    model,
    folder: Path,
    longest: int | None,
    arguments: argparse.Namespace,
    log: Callable[[str], None],
) -> str | None:
    """Writes the SavedModel, the ONNX file and the LiteRT file into `folder`, logging each;
    returns why LiteRT was not written (the other two are still verified), or None."""
    from keras_posenc import export

    clock = time.perf_counter()
    bound = {"max_sequence_length": longest}
    export.save_saved_model(model, folder / "saved_model", **bound)
    log(f"SavedModel written ({time.perf_counter() - clock:.1f} s)")

    clock = time.perf_counter()
    export.save_onnx(
        model, folder / "model.onnx", arguments.opset, rotary=arguments.rotary, **bound
    )
    constants = export.onnx_constant_bytes(folder / "model.onnx")
    parameters = export.parameter_bytes(model)
    tables = export.position_table_bytes(model, longest)
    log(
        f"ONNX opset {arguments.opset} written ({time.perf_counter() - clock:.1f} s): "
        f"constants {constants:,} B = parameters {parameters:,} B + position tables "
        f"{tables:,} B {constants - parameters - tables:+,} B"
    )

    clock = time.perf_counter()
    litert_error = None
    try:
        export.save_litert(model, folder / "model.tflite", **bound)
        log(
            f"LiteRT written ({time.perf_counter() - clock:.1f} s): "
            f"{(folder / 'model.tflite').stat().st_size:,} B, built-in ops only"
        )
    except export.ExportError as error:  # the other two are still verified
        litert_error = str(error)
        log(f"LiteRT NOT written: {error}")
    return litert_error


def _verified(
    model, folder: Path, longest: int | None, arguments: argparse.Namespace, log, litert_error
) -> dict:
    """`verify_export` of the files in `folder` (LiteRT's unless it was not written)."""
    from keras_posenc import export

    cases = export.verification_cases(
        model, arguments.batch_sizes, arguments.sequence_lengths, longest
    )
    log(f"verifying {len(cases)} cases against Keras ...")
    return export.verify_export(
        model,
        folder / "saved_model",
        folder / "model.onnx",
        litert_path=None if litert_error else folder / "model.tflite",
        batch_sizes=arguments.batch_sizes,
        sequence_lengths=arguments.sequence_lengths,
        max_sequence_length=longest,
        repeats=arguments.repeats,
        timed_shapes=TABLE_SHAPES,  # the latencies the table shows; the rest run once
        progress=lambda line: log("  " + line),
        raise_on_failure=False,
    )


def _latency(report: dict, runtime: str, batch: int, sequence: int) -> float | None:
    for case in report["cases"]:
        if (case["batch"], case["sequence"]) == (batch, sequence):
            return case["runtimes"][runtime]["latency_ms"]
    return None


def table(reports: dict[str, dict | None]) -> str:
    """The results as a text table: one row per model and runtime."""
    shapes = [f"b{b}xs{s}" for b, s in TABLE_SHAPES]
    header = [
        "encoder",
        "runtime",
        "max abs err",
        "max rel err",
        "tol used",
        *(f"ms {shape}" for shape in shapes),
        *(f"/TF {shape}" for shape in shapes),
        "result",
    ]
    rows = [header]
    for name, report in reports.items():
        if report is None:
            rows.append([name, "-", "-", "-", "-", *["-"] * 2 * len(shapes), "ERROR"])
            continue
        for runtime in report["runtimes"]:
            summary = report["summary"][runtime]
            latencies = [_latency(report, runtime, b, s) for b, s in TABLE_SHAPES]
            baselines = [_latency(report, "saved_model", b, s) for b, s in TABLE_SHAPES]
            if summary.get("reference"):
                errors, result = ["reference", "", ""], ""
            else:
                errors = [
                    f"{summary['max_abs_error']:.1e}",
                    f"{summary['max_rel_error']:.1e}",
                    f"{summary['tolerance_used']:.2f}",
                ]
                result = "pass" if summary["passed"] else "FAIL"
            rows.append(
                [
                    name,
                    runtime,
                    *errors,
                    *("-" if t is None else f"{t:.2f}" for t in latencies),
                    *(
                        "-" if t is None or base is None else f"{t / base:.2f}"
                        for t, base in zip(latencies, baselines, strict=True)
                    ),
                    result,
                ]
            )
        if report.get("litert_error"):
            cells = ["not exported", "", ""]
            rows.append([name, "litert", *cells, *["-"] * 2 * len(shapes), "ERROR"])
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = [
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(lines)


TABLE_NOTES = """\
Errors are the largest over all verified shapes, against Keras. max rel err: |runtime - keras|
/ |keras| over nonzero outputs, as numpy reports it (large where an output is near zero).
tol used: max |runtime - keras| / (atol + rtol |keras|) with atol=1e-5, rtol=1e-4 for float32
(1e-2 for float16); pass = allclose = tol used <= 1. ms: median latency, the runtimes
interleaved in one process; /TF: that latency over the SavedModel's (TensorFlow) latency."""


def closing_line(reports: dict[str, dict | None], out: Path) -> str:
    """What happened to each model, in one line: passed, failed (files kept) or not written."""
    failed = [name for name, report in reports.items() if report and not report["passed"]]
    refused = [name for name, report in reports.items() if report is None]
    if not failed and not refused:
        return f"All {len(reports)} verification(s) passed; artifacts in {out}/"
    parts = []
    if failed:
        parts.append(
            f"verification FAILED for {', '.join(failed)} (files and report kept in "
            f"{out}/<name>/ to inspect)"
        )
    if refused:
        parts.append(f"NOT exported: {', '.join(refused)} (see ERROR above; nothing written)")
    passed = len(reports) - len(failed) - len(refused)
    return f"{passed} of {len(reports)} passed; " + "; ".join(parts)


def run(arguments: argparse.Namespace) -> int:
    """Runs the export job; returns the exit status (0 when every verification passed)."""
    todo = jobs(arguments)
    try:
        arguments.out.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        print(f"error: cannot create --out {arguments.out}: {error.strerror}", file=sys.stderr)
        return 1
    reports: dict[str, dict | None] = {}
    for index, job in enumerate(todo, 1):

        def log(line: str, step: str = f"[{index}/{len(todo)}] {job.name}") -> None:
            print(f"{step}: {line}", flush=True)

        try:
            reports[job.name] = export_one(job, arguments, log)
        except Exception as error:  # one model's failure must not stop the others
            log(f"ERROR {type(error).__name__}: {error}")
            reports[job.name] = None
    print()
    print(table(reports))
    print()
    print(TABLE_NOTES)
    print()
    print(closing_line(reports, arguments.out))
    passed = all(report is not None and report["passed"] for report in reports.values())
    return 0 if passed else 1
