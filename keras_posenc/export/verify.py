"""Verification: Keras and every exported runtime on the same inputs, compared."""

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

from keras_posenc.export.errors import VerificationError
from keras_posenc.export.files import is_saved_model, write_json
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
    parameter_bytes,
    position_table_bytes,
)
from keras_posenc.export.signature import _all_layers, input_signature, serving_function

BATCH_SIZES = (1, 2, 3, 8)
SEQUENCE_LENGTHS = (1, 2, 17, 128, 511)
RUNTIMES = ("keras", "saved_model", "onnxruntime")


def longest_sequence(model: keras.Model) -> int | None:
    """The longest sequence the model allows, when its layers say: the smallest learned table."""
    from keras_posenc.learned import LearnedPositionalEmbedding

    lengths = [
        layer.max_length
        for layer in _all_layers(model)
        if isinstance(layer, LearnedPositionalEmbedding)
    ]
    return min(lengths) if lengths else None


def verification_shapes(
    longest: int | None,
    batch_sizes: Sequence[int] = BATCH_SIZES,
    sequence_lengths: Sequence[int] = SEQUENCE_LENGTHS,
) -> list[tuple[int, int]]:
    """`(batch, sequence)` pairs: every batch size with every length up to `longest`, and it."""
    lengths = sorted(
        {n for n in sequence_lengths if longest is None or n <= longest}
        | ({longest} if longest else set())
    )
    return [(batch, length) for batch in batch_sizes for length in lengths]


def default_inputs(
    model: keras.Model, batch: int, sequence: int, longest: int | None, seed: int = 0
) -> dict[str, np.ndarray]:
    """Random inputs for `model`, by input name, for one verification shape.

    Float inputs are standard normal; integer inputs of rank >= 1 are token ids below the
    smallest `Embedding` vocabulary in the model (0 or 1 without one); a scalar integer
    input is a start index, `(longest - sequence) // 2` (so the run stays within the
    longest length; 0 when none is known).
    """
    rng = np.random.default_rng([seed, batch, sequence])
    vocabularies = [
        layer.input_dim for layer in _all_layers(model) if isinstance(layer, keras.layers.Embedding)
    ]
    high = min(vocabularies) if vocabularies else 2
    feeds = {}
    for spec in input_signature(model):
        shape = [batch, sequence, *spec.shape[2:]][: spec.shape.rank]
        dtype = spec.dtype.as_numpy_dtype
        if spec.dtype.is_floating:
            value = rng.standard_normal(shape)
        elif spec.dtype == tf.bool:
            value = rng.integers(0, 2, shape)
        elif spec.shape.rank == 0:
            value = np.array(max((longest or sequence) - sequence, 0) // 2)
        else:
            value = rng.integers(0, high, shape)
        feeds[spec.name] = np.asarray(value).astype(dtype)
    return feeds


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
    """Keras, the reloaded SavedModel and onnxruntime, each called on `{input name: array}`."""

    def __init__(self, model: keras.Model, saved_model_path: Path, onnx_path: Path):
        import onnxruntime

        self.specs = input_signature(model)
        # Keras runs the model as a graph traced apart from the exported one but with the
        # same dynamic axes: the same kernels, so the SavedModel's error measures what
        # saving and loading change (a graph traced per shape, or eager execution, picks
        # other kernels and differs from either by ~1e-6 of float32 rounding).
        self.keras = serving_function(model)
        self.serve = tf.saved_model.load(str(saved_model_path)).signatures["serving_default"]
        options = onnxruntime.SessionOptions()
        options.log_severity_level = 3
        # After a run onnxruntime's threads spin, waiting for the next one; interleaved
        # with TensorFlow they would take its cores and slow whichever call comes next
        # (by 3 ms, double, at batch 1 x sequence 128 on 2 cores).
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        self.session = onnxruntime.InferenceSession(
            str(onnx_path), options, providers=["CPUExecutionProvider"]
        )
        self.onnx_outputs = [o.name for o in self.session.get_outputs()]

    def calls(self, feeds: dict) -> dict[str, Callable[[], dict]]:
        """Per runtime, a call with the inputs already converted, returning `{name: output}`."""
        tensors = {name: tf.constant(value) for name, value in feeds.items()}
        ordered = [tensors[spec.name] for spec in self.specs]
        return {
            "keras": lambda: self.keras(*ordered),
            "saved_model": lambda: self.serve(**tensors),
            "onnxruntime": lambda: dict(
                zip(self.onnx_outputs, self.session.run(None, feeds), strict=True)
            ),
        }


def verify_export(
    model: keras.Model,
    saved_model_path: str | os.PathLike,
    onnx_path: str | os.PathLike,
    *,
    batch_sizes: Sequence[int] = BATCH_SIZES,
    sequence_lengths: Sequence[int] = SEQUENCE_LENGTHS,
    max_sequence_length: int | None = None,
    make_inputs: Callable[[int, int], dict[str, np.ndarray]] | None = None,
    repeats: int = 5,
    report_path: str | os.PathLike | None = None,
    progress: Callable[[str], None] | None = None,
    raise_on_failure: bool = True,
) -> dict:
    """Runs Keras, the reloaded SavedModel and onnxruntime on the same inputs and compares them.

    Shapes: every batch size with every sequence length up to the longest the model
    allows, and that longest length (`max_sequence_length`, else the smallest learned
    position table, else none). None of them is a traced shape: both artifacts were
    traced with dynamic axes. A float32 model passes when each runtime meets
    `allclose(atol=1e-5, rtol=1e-4)` against Keras; the runtimes of a float16 model,
    Keras included, are compared with its float32 twin at `atol=rtol=1e-2`. A bfloat16
    model is checked as the float32 copy that was exported (see `exportable_model`).
    Latency is the median of `repeats` calls per runtime, interleaved, after a warm-up.

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
        batch_sizes: batch sizes to check.
        sequence_lengths: sequence lengths to check (those past the longest are left out).
        max_sequence_length: the longest sequence the model allows, checked as well.
        make_inputs: `make_inputs(batch, sequence)` returns `{input name: array}`;
            default `default_inputs`.
        repeats: timed calls per runtime and shape.
        report_path: where to write the report as JSON (whole or not at all), if given.
        progress: called with a line of text after each shape.
        raise_on_failure: raise `VerificationError` (after writing the report) on failure.

    Returns:
        The report: `passed`; `cases`, per shape each runtime's `max_abs_error`,
        `max_rel_error`, `passed` and `latency_ms`; `summary`, per runtime the largest
        errors over all shapes; `sizes` (bytes of ONNX constants, of the model's weights
        and of its position tables); `tolerance`; `notes`.

    Raises:
        VerificationError: a runtime differs from Keras beyond the tolerance (with
            `raise_on_failure`); the report is written first.
    """
    saved_model_path = Path(saved_model_path)
    onnx_path = Path(onnx_path)
    if not is_saved_model(saved_model_path):
        raise FileNotFoundError(
            errno.ENOENT,
            f"No SavedModel at {str(saved_model_path)!r}; write one with save_saved_model",
            str(saved_model_path),
        )
    if not onnx_path.is_file():
        raise FileNotFoundError(
            errno.ENOENT,
            f"No ONNX file at {str(onnx_path)!r}; write one with save_onnx",
            str(onnx_path),
        )
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats must be a positive integer, got {repeats!r}.")

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
    shapes = verification_shapes(longest, batch_sizes, sequence_lengths)
    if make_inputs is None:

        def make_inputs(batch: int, sequence: int) -> dict[str, np.ndarray]:
            return default_inputs(exported, batch, sequence, longest)

    runtimes = _Runtimes(exported, saved_model_path, onnx_path)
    compared = RUNTIMES if low_precision else RUNTIMES[1:]
    started = time.perf_counter()
    cases = []
    for batch, sequence in shapes:
        feeds = make_inputs(batch, sequence)
        calls = runtimes.calls(feeds)
        outputs = {name: _numpy(call()) for name, call in calls.items()}  # also the warm-up
        if twin is not None:
            reference = _numpy(twin(*(tf.constant(feeds[spec.name]) for spec in runtimes.specs)))
        else:
            reference = outputs["keras"]
        latencies = _median_latencies(calls, repeats)
        case = {"batch": batch, "sequence": sequence, "runtimes": {}}
        for name in RUNTIMES:
            entry = compare_outputs(outputs[name], reference, tolerance) if name in compared else {}
            case["runtimes"][name] = {**entry, "latency_ms": latencies[name]}
        case["passed"] = all(case["runtimes"][name]["passed"] for name in compared)
        cases.append(case)
        if progress is not None:
            worst = max(case["runtimes"][name]["max_abs_error"] for name in compared)
            progress(
                f"batch {batch:>2} x sequence {sequence:>4}: max abs error {worst:.1e}, "
                f"{'pass' if case['passed'] else 'FAIL'}"
            )

    summary = {}
    for name in RUNTIMES:
        entries = [case["runtimes"][name] for case in cases]
        summary[name] = (
            {
                "max_abs_error": max(e["max_abs_error"] for e in entries),
                "max_rel_error": max(e["max_rel_error"] for e in entries),
                "tolerance_used": max(e["tolerance_used"] for e in entries),
                "passed": all(e["passed"] for e in entries),
            }
            if name in compared
            else {"reference": True}
        )
    report = {
        "model": model.name,
        "passed": all(case["passed"] for case in cases),
        "saved_model": str(saved_model_path),
        "onnx": str(onnx_path),
        "reference": "keras float32 twin" if low_precision else "keras",
        "tolerance": tolerance,
        "relative_error": "max |runtime - reference| / |reference| over nonzero references",
        "tolerance_used": "max |runtime - reference| / (atol + rtol |reference|); pass <= 1",
        "longest_sequence": longest,
        "repeats": repeats,
        "seconds": round(time.perf_counter() - started, 2),
        "notes": notes,
        "sizes": {
            "onnx_constant_bytes": onnx_constant_bytes(onnx_path),
            "parameter_bytes": parameter_bytes(exported),
            "position_table_bytes": position_table_bytes(exported),
        },
        "summary": summary,
        "cases": cases,
    }
    if report_path is not None:
        write_json(report, report_path)
    if raise_on_failure and not report["passed"]:
        failed = [
            f"batch {c['batch']} x sequence {c['sequence']}" for c in cases if not c["passed"]
        ]
        raise VerificationError(
            f"The export of {model.name!r} differs from Keras beyond {tolerance} on "
            f"{len(failed)} of {len(cases)} shapes ({', '.join(failed[:3])}"
            f"{', ...' if len(failed) > 3 else ''}); see "
            + (str(report_path) if report_path is not None else "the error's report"),
            report,
        )
    return report


def _numpy(outputs: dict) -> dict[str, np.ndarray]:
    return {name: np.asarray(value) for name, value in outputs.items()}
