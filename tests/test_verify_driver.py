"""The steps of `verify_export` (`keras_posenc.export.verify.driver`), each on its own.

Expected errors come from numpy (`np.abs`, `np.allclose`) on the arrays the fake runtimes
return, or from the weights of two models; never from the driver's own comparison.
"""

from __future__ import annotations

import json
import types

import keras
import numpy as np
import onnxruntime
import pytest

from keras_posenc import LearnedPositionalEmbedding, SinusoidalPositionalEncoding
from keras_posenc import export as kpe
from keras_posenc.export.verify import driver

WIDTH, ROWS = 4, 8


def _learned(seed: int, dtype: str = "float32") -> keras.Model:
    keras.utils.set_random_seed(seed)
    x = keras.Input((None, WIDTH), name="x", dtype=dtype)
    return keras.Model(x, {"y": LearnedPositionalEmbedding(ROWS, dtype=dtype, name="table")(x)})


def test_artifact_paths_need_one_artifact_and_each_must_exist(tmp_path):
    with pytest.raises(ValueError, match="Nothing to verify"):
        driver.artifact_paths(None, None, None)
    with pytest.raises(FileNotFoundError, match="No SavedModel"):
        driver.artifact_paths(tmp_path / "none", None, None)
    with pytest.raises(FileNotFoundError, match="No ONNX file"):
        driver.artifact_paths(None, tmp_path / "none.onnx", None)
    with pytest.raises(FileNotFoundError, match="No LiteRT file"):
        driver.artifact_paths(None, None, tmp_path / "none.tflite")
    (tmp_path / "m.onnx").write_bytes(b"")
    (tmp_path / "m.tflite").write_bytes(b"")
    paths = driver.artifact_paths(None, str(tmp_path / "m.onnx"), tmp_path / "m.tflite")
    assert paths == {"onnxruntime": tmp_path / "m.onnx", "litert": tmp_path / "m.tflite"}


@pytest.mark.parametrize("repeats, longest", [(0, None), (True, None), (2.0, None), (1, 0)])
def test_checked_options_refuse_what_is_not_a_positive_integer(repeats, longest):
    with pytest.raises(ValueError, match="must be a positive integer"):
        driver.checked_options(repeats, longest)
    driver.checked_options(3, np.int64(5))  # fine


def test_a_float32_plan_compares_the_artifacts_with_keras_on_every_length_to_the_table():
    planned = driver.plan(_learned(0), (1, 2), (3, 17), None, None)
    assert planned.twin is None and planned.notes == []
    assert planned.tolerance == {"atol": 1e-5, "rtol": 1e-4}
    assert planned.longest == ROWS
    # 17 is past the table: the longest case is the table's length.
    assert planned.cases == [
        {"batch": 1, "sequence": 3},
        {"batch": 1, "sequence": ROWS},
        {"batch": 2, "sequence": 3},
        {"batch": 2, "sequence": ROWS},
    ]
    feeds = planned.feeds_for(planned.cases[1])
    assert feeds["x"].shape == (1, ROWS, WIDTH) and feeds["x"].dtype == np.float32


def test_a_float16_plan_compares_every_runtime_with_the_float32_twin():
    planned = driver.plan(_learned(0, "float16"), (1,), (3,), None, None)
    assert planned.tolerance == {"atol": 1e-2, "rtol": 1e-2}
    assert planned.twin is not None
    assert any("float32 twin" in note for note in planned.notes)


def test_make_inputs_replaces_the_default_inputs_on_the_shapes_alone():
    x = keras.Input((None, WIDTH), name="x")
    start = keras.Input((), dtype="int32", name="start", batch_size=1)
    model = keras.Model([x, start], SinusoidalPositionalEncoding()(x, start_index=start[0]))
    made = []

    def make_inputs(batch, sequence):
        made.append((batch, sequence))
        return {"x": np.zeros((batch, sequence, WIDTH), np.float32), "start": np.array([0])}

    planned = driver.plan(model, (1, 2), (3,), 64, make_inputs)
    # The default cases run each shape from several starts; the caller's inputs run once.
    assert planned.cases == [{"batch": 1, "sequence": 3}, {"batch": 1, "sequence": 64}] + [
        {"batch": 2, "sequence": 3},
        {"batch": 2, "sequence": 64},
    ]
    planned.feeds_for(planned.cases[2])
    assert made == [(2, 3)]


def test_run_outputs_keep_a_runtime_error_and_raise_a_keras_one():
    def boom():
        raise RuntimeError("boom " + "x" * 400)

    outputs = driver.run_outputs({"keras": lambda: {"y": [1.0]}, "litert": boom})
    assert outputs["keras"]["y"].tolist() == [1.0]
    assert outputs["litert"]["error"].startswith("RuntimeError: boom x")
    assert len(outputs["litert"]["error"]) == len("RuntimeError: ") + 300
    with pytest.raises(RuntimeError, match="boom"):
        driver.run_outputs({"keras": boom})


def _fake_runtimes(results: dict) -> types.SimpleNamespace:
    """Runtimes whose calls return the given arrays (or raise the given exceptions)."""

    def call(value):
        def run():
            if isinstance(value, Exception):
                raise value
            return {"y": value}

        return run

    spec = types.SimpleNamespace(name="x")
    return types.SimpleNamespace(
        names=list(results),
        runners={"keras": types.SimpleNamespace(specs=[spec])},
        calls=lambda feeds: {name: call(value) for name, value in results.items()},
    )


def _planned(twin=None) -> driver.Plan:
    tolerance = {"atol": 1e-5, "rtol": 1e-4}
    return driver.Plan(None, [], tolerance, twin, None, None, [], lambda case: {})


@pytest.mark.parametrize("offset", [3e-6, 4e-4])
def test_run_case_compares_each_artifact_with_keras(offset):
    rng = np.random.default_rng(0)
    expected = rng.standard_normal((2, 5, WIDTH)).astype(np.float32)
    near = expected + np.float32(offset) * rng.standard_normal(expected.shape).astype(np.float32)
    fake = _fake_runtimes({"keras": expected, "onnxruntime": near})
    shape = {"batch": 2, "sequence": 5, "probe_offset": 7}
    case = driver.run_case(_planned(), fake, ["onnxruntime"], shape, {}, repeats=2)
    assert set(case) == {"batch", "sequence", "runtimes", "passed"}
    onnx = case["runtimes"]["onnxruntime"]
    difference = np.abs(near.astype(np.float64) - expected.astype(np.float64))
    assert onnx["max_abs_error"] == pytest.approx(difference.max(), rel=1e-12)
    assert (
        onnx["passed"] == case["passed"] == bool(np.allclose(near, expected, atol=1e-5, rtol=1e-4))
    )
    assert case["passed"] is (offset < 1e-5)
    assert set(case["runtimes"]["keras"]) == {"latency_ms"}  # the reference, not compared
    assert onnx["latency_ms"] >= 0.0


def test_run_case_fails_a_runtime_that_raises_and_times_only_those_that_answer():
    ones = np.ones((1, 2, WIDTH), np.float32)
    fake = _fake_runtimes({"keras": ones, "litert": ValueError("resize")})
    case = driver.run_case(_planned(), fake, ["litert"], {"batch": 1, "sequence": 2}, {}, 1)
    litert = case["runtimes"]["litert"]
    assert not case["passed"] and not litert["passed"]
    assert litert["problems"] == ["ValueError: resize"]
    assert litert["max_abs_error"] == float("inf") and litert["latency_ms"] is None


def test_with_a_twin_keras_is_compared_too():
    twin_values = np.zeros((1, 2, WIDTH), np.float32)
    keras_values = twin_values + np.float32(0.5)

    def twin(*tensors):
        return {"y": twin_values}

    fake = _fake_runtimes({"keras": keras_values})
    feeds = {"x": np.zeros((1, 2, WIDTH), np.float32)}
    case = driver.run_case(_planned(twin), fake, ["keras"], {"batch": 1, "sequence": 2}, feeds, 1)
    assert case["runtimes"]["keras"]["max_abs_error"] == 0.5
    assert not case["passed"]


def test_a_wrong_file_fails_by_the_difference_of_the_tables_and_the_report_is_written(tmp_path):
    exported = _learned(1)
    onnx_path = kpe.save_onnx(exported, tmp_path / "model.onnx")
    other = _learned(2)
    difference = np.abs(
        exported.get_layer("table").weights[0].numpy().astype(np.float64)
        - other.get_layer("table").weights[0].numpy()
    ).max()
    lines = []
    report_path = tmp_path / "report.json"
    with pytest.raises(kpe.VerificationError, match="onnxruntime on 4 of 4 cases") as raised:
        kpe.verify_export(
            other,
            onnx_path=onnx_path,
            batch_sizes=(1, 2),
            sequence_lengths=(3,),
            repeats=1,
            report_path=report_path,
            progress=lines.append,
        )
    report = raised.value.report
    assert json.loads(report_path.read_text())["passed"] is False
    # Every row of the table is reached (the longest case is the table's length).
    assert report["summary"]["onnxruntime"]["max_abs_error"] == pytest.approx(difference, abs=1e-6)
    assert report["positions"]["covered"] == [[0, ROWS - 1]]
    assert list(report)[:3] == ["model", "passed", "onnx"]
    assert report["runtimes"] == ["keras", "onnxruntime"]
    assert report["sizes"]["parameter_bytes"] == ROWS * WIDTH * 4
    assert len(lines) == 4 and all(line.endswith("FAIL") for line in lines)


def test_timed_shapes_time_the_first_case_of_each_and_run_the_others_once(tmp_path):
    exported = _learned(1)
    onnx_path = kpe.save_onnx(exported, tmp_path / "model.onnx")
    calls = []
    session_run = onnxruntime.InferenceSession.run

    def counted(self, *args, **kwargs):
        calls.append(1)
        return session_run(self, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(onnxruntime.InferenceSession, "run", counted)
        report = kpe.verify_export(
            exported,
            onnx_path=onnx_path,
            batch_sizes=(1, 2),
            sequence_lengths=(3,),
            repeats=4,
            timed_shapes=[(2, 3)],
        )
    latencies = {
        (case["batch"], case["sequence"]): case["runtimes"]["onnxruntime"]["latency_ms"]
        for case in report["cases"]
    }
    assert latencies[(2, 3)] > 0
    assert all(latency is None for shape, latency in latencies.items() if shape != (2, 3))
    # One compared call per case, and the repeats of the one timed case.
    assert len(calls) == len(report["cases"]) + 4
