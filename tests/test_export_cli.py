"""The export job, `python -m export`: artifacts, report, table and exit status."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import keras
import numpy as np
import onnx
import pytest

from keras_posenc import SinusoidalPositionalEncoding
from keras_posenc import export as kpe

REPOSITORY = Path(__file__).resolve().parents[1]
if str(REPOSITORY) not in sys.path:  # `export` is a top-level folder of the repository
    sys.path.insert(0, str(REPOSITORY))

from export import main  # noqa: E402

# What the job writes into each model's folder (the manifest lists the files it wrote).
ARTIFACTS = [".keras-posenc-files", "model.onnx", "model.tflite", "report.json", "saved_model"]
SMALL_GRID = ["--batch-sizes", "1,2", "--sequence-lengths", "3,17", "--repeats", "1"]


def test_python_m_export_writes_verifies_and_reports(tmp_path):
    out = tmp_path / "artifacts"
    result = subprocess.run(
        [sys.executable, "-m", "export", "--encoder", "learned", "--out", str(out), *SMALL_GRID],
        cwd=REPOSITORY,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"},
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    lines = result.stdout.splitlines()
    for step in ("built", "SavedModel written", "ONNX opset 17 written", "verifying"):
        assert any(line.startswith("[1/1] learned: " + step) for line in lines), step
    rows = [line.split() for line in lines if line.startswith("learned ")]
    assert [row[1] for row in rows] == ["keras", "saved_model", "onnxruntime", "litert"]
    assert [row[-1] for row in rows[1:]] == ["pass", "pass", "pass"]

    folder = out / "learned"
    assert sorted(p.name for p in out.iterdir()) == ["learned"]  # no temporary folders left
    assert sorted(p.name for p in folder.iterdir()) == ARTIFACTS
    report = json.loads((folder / "report.json").read_text())
    assert report["passed"] is True
    assert report["opset"] == 17
    # every batch size with every length, and the longest the learned table allows
    shapes = {(case["batch"], case["sequence"]) for case in report["cases"]}
    assert shapes == {(b, s) for b in (1, 2) for s in (3, 17, 512)}
    assert report["summary"]["onnxruntime"]["max_abs_error"] <= 1e-5
    assert report["summary"]["saved_model"]["max_abs_error"] <= 1e-6
    onnx.checker.check_model(onnx.load(str(folder / "model.onnx")), full_check=True)


@pytest.fixture
def keras_file(tmp_path):
    inputs = keras.Input((None, 8), name="embeddings")
    outputs = keras.layers.Dense(4)(SinusoidalPositionalEncoding()(inputs))
    path = tmp_path / "my_model.keras"
    keras.Model(inputs, outputs).save(path)
    return path


def test_model_option_exports_a_saved_keras_model(keras_file, tmp_path, capsys):
    out = tmp_path / "out"
    status = main(
        ["--model", str(keras_file), "--max-length", "40", "--out", str(out), *SMALL_GRID]
    )
    assert status == 0, capsys.readouterr().out
    report = json.loads((out / "my_model" / "report.json").read_text())
    assert report["passed"] and report["longest_sequence"] == 40
    assert {case["sequence"] for case in report["cases"]} == {3, 17, 40}


def test_failed_verification_leaves_artifacts_and_exits_1(keras_file, tmp_path, monkeypatch):
    convert = kpe.onnx_model

    def perturbed(model, opset=kpe.DEFAULT_OPSET, **options):
        proto = convert(model, opset, **options)
        (kernel,) = [i for i in proto.graph.initializer if tuple(i.dims) == (8, 4)]
        values = onnx.numpy_helper.to_array(kernel) + np.float32(1e-3)
        kernel.CopyFrom(onnx.numpy_helper.from_array(values, kernel.name))
        return proto

    monkeypatch.setattr(kpe.onnx_export, "onnx_model", perturbed)
    out = tmp_path / "out"
    assert main(["--model", str(keras_file), "--out", str(out), *SMALL_GRID]) == 1
    folder = out / "my_model"
    assert sorted(p.name for p in folder.iterdir()) == ARTIFACTS
    report = json.loads((folder / "report.json").read_text())
    assert report["passed"] is False
    assert report["summary"]["onnxruntime"]["passed"] is False
    assert report["summary"]["saved_model"]["passed"] is True


def test_failed_export_writes_nothing_and_exits_1(tmp_path, capsys):
    inputs = keras.Input((None, 4), name="embeddings")
    path = tmp_path / "celu.keras"
    keras.Model(inputs, keras.layers.Activation("celu")(inputs)).save(path)  # Expm1: no ONNX
    out = tmp_path / "out"
    assert main(["--model", str(path), "--out", str(out), *SMALL_GRID]) == 1
    output = capsys.readouterr().out
    assert "ERROR ExportError" in output and "Expm1" in output
    assert list(out.iterdir()) == []


@pytest.mark.parametrize(
    "arguments, message",
    [
        (["--opset", "22"], "--opset 22 is not supported"),
        (["--model", "/nonexistent/model.keras"], "no such file"),
        (["--batch-sizes", "0,2"], "positive integers"),
        (["--encoder", "nope"], "invalid choice"),
        (["--max-sequence-length", "0"], "expected a positive integer, got '0'"),
        (
            ["--batch-sizes", "-1,2"],
            "positive integers separated by commas (such as 1,2,8), got '-1,2'",
        ),
        (["--sequence-lengths", "3,x"], "got '3,x'"),
    ],
)
def test_bad_arguments_are_usage_errors(arguments, message, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        main([*arguments, "--out", str(tmp_path / "out")])
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_unwritable_out_folder(capsys):
    # /sys refuses new folders even to root.
    assert main(["--encoder", "learned", "--out", "/sys/keras_posenc_artifacts"]) == 1
    assert "cannot create --out /sys/keras_posenc_artifacts" in capsys.readouterr().err
    assert not Path("/sys/keras_posenc_artifacts").exists()


# --------------------------------------------------------------------------------------
# The console script


def _console_script() -> str:
    """The `keras-posenc-export` entry point as pyproject.toml declares it."""
    import tomllib

    scripts = tomllib.loads((REPOSITORY / "pyproject.toml").read_text())["project"]["scripts"]
    return scripts["keras-posenc-export"]


def test_console_script_runs_from_any_folder_without_tensorflow_noise(keras_file, tmp_path):
    module, function = _console_script().split(":")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    environment = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    environment["PYTHONPATH"] = str(REPOSITORY)  # the package, as an installed one would be
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            f"import sys; from {module} import {function}; sys.exit({function}())",
            "--model",
            str(keras_file),
            "--max-length",
            "20",
            *SMALL_GRID,
        ],
        cwd=elsewhere,
        capture_output=True,
        text=True,
        timeout=600,
        env=environment,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    # TensorFlow's start-up lines (absl preamble, oneDNN, CPU features, cuInit) are gone.
    for noise in ("cuInit", "oneDNN", "absl::InitializeLog", "cpu_feature_guard", "XNNPACK"):
        assert noise not in result.stderr + result.stdout, noise
    assert "[1/1] my_model: LiteRT written" in result.stdout
    assert (elsewhere / "keras-posenc-artifacts" / "my_model" / "model.tflite").is_file()
    assert sorted(p.name for p in elsewhere.iterdir()) == ["keras-posenc-artifacts"]


def test_default_out_is_export_artifacts_only_in_the_checkout(tmp_path, monkeypatch):
    from keras_posenc_cli import arguments

    monkeypatch.chdir(REPOSITORY)
    assert arguments.default_out() == REPOSITORY / "export" / "artifacts"
    monkeypatch.chdir(tmp_path)
    assert arguments.default_out() == Path("keras-posenc-artifacts")
    assert arguments.parse_arguments([]).out == Path("keras-posenc-artifacts")


def test_the_front_doors_defaults_are_the_packages():
    from keras_posenc_cli import arguments
    from keras_posenc_cli.encoders import DEFAULT_ENCODERS

    assert arguments.ENCODERS == tuple(DEFAULT_ENCODERS)
    assert arguments.BATCH_SIZES == kpe.BATCH_SIZES
    assert arguments.SEQUENCE_LENGTHS == kpe.SEQUENCE_LENGTHS
    assert arguments.DEFAULT_OPSET == kpe.DEFAULT_OPSET
    assert arguments.SUPPORTED_OPSETS == kpe.SUPPORTED_OPSETS


@pytest.mark.parametrize(
    "arguments, status, shown",
    [(["--help"], 0, "usage: python -m export"), (["--opset", "9"], 2, "--opset 9 is not")],
)
def test_help_and_argument_errors_do_not_import_tensorflow(arguments, status, shown):
    probe = (
        "import sys\n"
        "from export import main\n"
        "try:\n"
        f"    main({arguments!r})\n"
        "except SystemExit as exit_:\n"
        "    print('status', exit_.code)\n"
        "print('loaded', sorted({'tensorflow', 'keras', 'keras_posenc'} & set(sys.modules)))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], cwd=REPOSITORY, capture_output=True, text=True, timeout=60
    )
    assert f"status {status}" in result.stdout, result.stdout + result.stderr
    assert "loaded []" in result.stdout
    assert shown in result.stdout + result.stderr


def test_a_refused_export_says_nothing_was_written_and_keeps_the_foreign_file(
    keras_file, tmp_path, capsys
):
    out = tmp_path / "out"
    (out / "my_model").mkdir(parents=True)
    foreign = out / "my_model" / "notes.txt"
    foreign.write_text("mine")
    assert main(["--model", str(keras_file), "--out", str(out), *SMALL_GRID]) == 1
    printed = capsys.readouterr().out
    last = printed.strip().splitlines()[-1]
    assert last == "0 of 1 passed; NOT exported: my_model (see ERROR above; nothing written)"
    assert "ERROR" in printed and "notes.txt" in printed
    assert foreign.read_text() == "mine"
    assert sorted(p.name for p in (out / "my_model").iterdir()) == ["notes.txt"]


def test_noise_filter_keeps_everything_else():
    from keras_posenc_cli import is_noise

    noise = [
        "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR",
        "I0000 00:00:1796114401.260192    6005 port.cc:153] oneDNN custom operations are on.",
        "E0000 00:00:1796115100.178549   18124 cuda_platform.cc:52] failed call to cuInit: x",
        "To enable the following instructions: AVX2 AVX512F, in other operations, rebuild",
        "INFO: Created TensorFlow Lite XNNPACK delegate for CPU.",
        'loc(callsite(fused["Einsum:", "m/attention_1/key_1/einsum/Einsum@f"] ...',
        "error: failed while converting: 'main': ",
    ]
    kept = [
        "E0000 00:00:1796115100.178549   18124 op.cc:1] a real error in a kernel",
        "Traceback (most recent call last):",
        "UserWarning: the model uses bfloat16",
    ]
    assert all(is_noise(line) for line in noise)
    assert not any(is_noise(line) for line in kept)


@pytest.mark.parametrize(
    "arguments, message",
    [
        (["--max-sequence-length", str(2**24 + 1)], "--max-sequence-length 16777217 is past"),
        (["--max-length", "99999999999999999999"], "is past 16777216"),
        (["--out", ""], "argument --out: empty: give the folder"),
        (["--batch-sizes", "1,99999999999999999999"], "larger than any tensor axis"),
    ],
)
def test_arguments_the_job_would_refuse_later_are_refused_before_tensorflow(
    arguments, message, capsys
):
    from keras_posenc_cli.arguments import parse_arguments

    with pytest.raises(SystemExit) as exit_:
        parse_arguments(arguments)
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err


def test_an_encoder_named_twice_is_exported_once():
    from keras_posenc_cli.arguments import parse_arguments

    chosen = parse_arguments(["--encoder", "rotary", "--encoder", "learned", "--encoder=rotary"])
    assert chosen.encoder == ["rotary", "learned"]


def test_the_front_doors_position_limit_is_the_packages():
    from keras_posenc.frequencies import MAX_POSITIONS
    from keras_posenc_cli import arguments

    assert arguments.MAX_POSITIONS == MAX_POSITIONS
