"""Train on JAX (one device and 8 with keras.distribution), serve from TensorFlow (issue #28).

Two fresh processes: tests/backends/test_distribution.py under `KERAS_BACKEND=jax` with 8
virtual CPU devices (`XLA_FLAGS` must be set before JAX starts, hence a process of its
own) trains the tiny RoPE encoder of tests/backends/tiny_encoder.py and the tiny decoder
of tests/backends/tiny_decoder.py on one device, with `DataParallel` and with
`ModelParallel`, and saves the ModelParallel models as `.keras`; then
tests/backends/serve_on_tensorflow.py under `KERAS_BACKEND=tensorflow` loads those files,
compares their outputs with JAX's and exports them with `keras_posenc.export` (the
decoder with `save_decoder`: onnxruntime-genai's graph and LiteRT, each verified).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from keras_hub_models import GENAI
from stablehlo_versions import UNREADABLE_OPERATION, tensorflow_reads_jax_exports

TESTS = Path(__file__).resolve().parent
BACKEND_TESTS = TESTS / "backends"
# Keras under TensorFlow against Keras under JAX on the same weights and tokens: the same
# formula with other kernels (XLA:CPU vs Eigen), so only float32 summation order and
# exp/softmax rounding differ. About ten reductions of <= 64 terms in sequence, each
# within gamma_64 ~ 3.8e-6 of the magnitudes it sums: 2e-5 of the output scale bounds it
# (measured: 6e-8 on the encoder's logits of size 0.6, 1.7e-6 on the decoder's of size
# 3.4). Another position row or a lost weight is 1e-2.
RELATIVE_TOLERANCE = 2e-5


def _environment(**variables: str) -> dict:
    return {
        **os.environ,
        "TF_CPP_MIN_LOG_LEVEL": "2",
        "PYTHONPATH": os.pathsep.join([str(TESTS.parent), os.environ.get("PYTHONPATH", "")]),
        **variables,
    }


@pytest.fixture(scope="module")
def jax_run(tmp_path_factory) -> tuple[subprocess.CompletedProcess, Path]:
    pytest.importorskip("jax")
    folder = tmp_path_factory.mktemp("trained_on_jax")
    flags = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
    run = subprocess.run(
        [sys.executable, "-m", "pytest", str(BACKEND_TESTS / "test_distribution.py")]
        + ["-q", "-p", "no:cacheprovider", "-rs"],
        cwd=TESTS.parent,
        env=_environment(
            KERAS_BACKEND="jax",
            XLA_FLAGS=flags.strip(),
            POSENC_DISTRIBUTION="1",
            POSENC_SERVE_DIR=str(folder),
        ),
        capture_output=True,
        text=True,
        timeout=600,
    )
    return run, folder


def test_keras_distribution_on_jax_trains_as_one_device(jax_run):
    run, _ = jax_run
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-3000:]
    # Every test ran (the module skips itself unless this run set POSENC_DISTRIBUTION).
    assert " passed" in run.stdout and "skipped" not in run.stdout, run.stdout[-3000:]


def test_trained_on_jax_loads_and_exports_under_tensorflow(jax_run):
    _, folder = jax_run
    if not (folder / "jax_outputs.npz").exists():
        pytest.fail("the JAX run saved no model (see the test above)")
    run = subprocess.run(
        [sys.executable, str(BACKEND_TESTS / "serve_on_tensorflow.py"), str(folder)],
        cwd=BACKEND_TESTS,
        env=_environment(KERAS_BACKEND="tensorflow"),
        capture_output=True,
        text=True,
        timeout=600,
    )
    lines = [line for line in run.stdout.splitlines() if line.startswith("RESULT ")]
    assert run.returncode == 0 and lines, run.stdout[-3000:] + run.stderr[-6000:]
    result = json.loads(lines[-1][len("RESULT ") :])
    print(json.dumps(result, indent=1))
    assert set(result["max_abs_difference"]) == {"tokens_5", "tokens_16", "tokens_32"}
    for name, difference in result["max_abs_difference"].items():
        scale = max(1.0, result["max_abs_output"][name])
        assert difference <= RELATIVE_TOLERANCE * scale, (name, difference)
    # Keras's own export from JAX (a SavedModel through jax2tf): XLA in both processes.
    jax_version = (folder / "jax_version.txt").read_text()
    if not tensorflow_reads_jax_exports(jax_version, result["tensorflow_version"]):
        # jax 0.12 writes StableHLO that TensorFlow 2.21 cannot read (stablehlo_versions.py).
        assert UNREADABLE_OPERATION in (result["keras_export_error"] or ""), result
    else:
        assert result["keras_export_error"] is None, result["keras_export_error"]
        scale = max(1.0, result["max_abs_output"]["tokens_16"])
        assert result["keras_export_max_abs_difference"] <= RELATIVE_TOLERANCE * scale
    assert result["passed"], result["summary"]
    for runtime in ("saved_model", "onnxruntime", "litert"):
        assert result["summary"][runtime]["passed"], runtime
    # The decoder: the same logits as under JAX (prefill and one-token steps with a
    # left-padded row), and save_decoder's files generate as Keras does.
    decoder = result["decoder"]
    assert set(decoder["max_abs_difference"]) == {f"logits_{i}" for i in range(4)}
    for name, difference in decoder["max_abs_difference"].items():
        scale = max(1.0, decoder["max_abs_output"][name])
        assert difference <= RELATIVE_TOLERANCE * scale, (name, difference)
    assert decoder["passed"], decoder["save_decoder"]
    # onnxruntime-genai runs the folder too where it is installed (`GENAI`).
    expected = {"onnxruntime", "litert", *GENAI}
    assert {name.split("/")[1] for name in decoder["save_decoder"]} == expected
