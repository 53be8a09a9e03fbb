"""`save_decoder` under JAX and PyTorch, the entries that need TensorFlow, the CLI (issue #37).

Each backend runs tests/backends/save_decoder_run.py in its own process: a DecoderBlock
step model and a keras_hub Llama exported (one attention each per backend, the other on
the other backend: `export_models.EXPORTS`), each verified against Keras on that backend,
the step model with TensorFlow never imported; the entries that need TensorFlow refuse by
name. Here, under TensorFlow, the same weights are exported again and each folder must
hold the same graph and give the same logits in onnxruntime.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import pytest

from keras_posenc.export import save_decoder
from keras_posenc.export.decoder.logit_tolerance import ATOL, RTOL, row_scale

TESTS = Path(__file__).resolve().parent
REPOSITORY = TESTS.parent
BACKEND_TESTS = TESTS / "backends"
sys.path.insert(0, str(BACKEND_TESTS))

import export_models  # noqa: E402

BACKENDS = ("jax", "torch")


@pytest.fixture(scope="module", params=BACKENDS)
def exported(request, tmp_path_factory) -> tuple[str, Path, dict]:
    """`(backend, folder, summary)` of save_decoder_run.py under `backend`."""
    backend = request.param
    pytest.importorskip(backend)
    out = tmp_path_factory.mktemp(f"export_{backend}")
    run = subprocess.run(
        [sys.executable, str(BACKEND_TESTS / "save_decoder_run.py"), str(out)],
        cwd=REPOSITORY,
        # One thread: the models are tiny, and PyTorch's threads only wait on each other
        # on a loaded machine (each step 15x slower on 2 busy cores).
        env={**os.environ, "KERAS_BACKEND": backend, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-6000:]
    return backend, out, json.loads(run.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def tensorflow_exports(tmp_path_factory) -> Path:
    """The same models exported here, under TensorFlow (verified elsewhere)."""
    out = tmp_path_factory.mktemp("export_tensorflow")
    for name, (build, max_length) in export_models.MODELS.items():
        model = build()
        for attention in export_models.ATTENTIONS:
            folder = out / f"{name}_{attention}"
            save_decoder(model, folder, max_length=max_length, attention=attention, verify=False)
    return out


def test_save_decoder_verified_against_keras_on_the_backend(exported):
    backend, _, summary = exported
    assert summary["backend"] == backend
    assert set(summary["reports"]) == {f"{m}_{a}" for m, a in export_models.EXPORTS[backend]}
    for name, report in summary["reports"].items():
        assert report["passed"] and report["keras_backend"] == backend, name
        assert len(report["cases"]) == 3 and report["cases"][1]["batch"] == 4, name
        assert report["cases"][2]["name"].startswith("teacher-forced"), name
        for case in report["cases"]:
            assert case["runtimes"]["onnxruntime"]["same_tokens"], (name, case["name"])


def _prefill_logits(folder: Path, prompts: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """The logits of one call of `folder/model.onnx` on a prompt, from empty caches."""
    session = onnxruntime.InferenceSession(
        str(folder / "model.onnx"), providers=["CPUExecutionProvider"]
    )
    max_length = json.loads((folder / "genai_config.json").read_text())["model"]["context_length"]
    feeds = {"input_ids": prompts, "attention_mask": mask}
    for value in session.get_inputs():
        if value.name.startswith("past_key_values."):
            shape = (len(prompts), value.shape[1], max_length, value.shape[3])
            feeds[value.name] = np.zeros(shape, np.float32)
    return session.run(["logits"], feeds)[0]


def test_same_graph_and_logits_as_the_tensorflow_export(exported, tensorflow_exports):
    backend, out, _ = exported
    rng = np.random.default_rng(1)
    for name in (f"{m}_{a}" for m, a in export_models.EXPORTS[backend]):
        ours, theirs = out / name, tensorflow_exports / name
        # The emitters read weights: the same weights give the same initializers and nodes.
        graphs = [onnx.load(str(folder / "model.onnx")).graph for folder in (ours, theirs)]
        assert [n.op_type for n in graphs[0].node] == [n.op_type for n in graphs[1].node]
        for a, b in zip(graphs[0].initializer, graphs[1].initializer, strict=True):
            assert a.name == b.name and np.array_equal(
                onnx.numpy_helper.to_array(a), onnx.numpy_helper.to_array(b)
            ), (name, a.name)
        prompts = rng.integers(1, 32, (2, 6)).astype(np.int64)
        mask = np.ones_like(prompts)
        prompts[1, :2], mask[1, :2] = 0, 0
        expected = _prefill_logits(theirs, prompts, mask)
        got = _prefill_logits(ours, prompts, mask)
        real = mask.astype(bool)
        # The verification's float32 tolerance for logits (check.py).
        allowed = ATOL + RTOL * row_scale(expected[real])
        assert np.all(np.abs(got[real] - expected[real]) <= allowed), name


def test_tensorflow_only_entries_refuse_by_name(exported):
    backend, _, summary = exported
    refusals = summary["refusals"]
    assert set(refusals) == {
        "save_saved_model",
        "save_onnx",
        "save_litert",
        "verify_export",
        "save_decoder(formats=litert)",
    }
    for entry, message in refusals.items():
        name = entry.split("(")[0]
        assert name in message and backend in message, message
        assert "KERAS_BACKEND=tensorflow" in message and ".keras" in message, message


def test_cli_runs_on_tensorflow_whatever_the_shell_exports(tmp_path):
    out = tmp_path / "artifacts"
    grid = ["--batch-sizes", "1", "--sequence-lengths", "3", "--repeats", "1"]
    result = subprocess.run(
        [sys.executable, "-m", "export", "--encoder", "learned", "--out", str(out), *grid],
        cwd=REPOSITORY,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "KERAS_BACKEND": "jax", "TF_CPP_MIN_LOG_LEVEL": "2"},
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert json.loads((out / "learned" / "report.json").read_text())["passed"] is True
    assert "exporting under TensorFlow (KERAS_BACKEND=jax is set)" in result.stderr
