"""The layers on JAX and PyTorch give TensorFlow's results (issue #28).

Each backend runs tests/backends/ in its own process (Keras picks its backend once per
process), comparing with the float64 formulas and with the TensorFlow outputs computed here
for the same cases (tests/backends/cases.py: the encoder layers; attention_cases.py: the
attention layers, their KV cache and a decoder_models step).
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

TESTS = Path(__file__).resolve().parent
BACKEND_TESTS = TESTS / "backends"


def _module(name: str):
    """tests/backends/<name>.py (its own imports, such as `cases`, found beside it)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(BACKEND_TESTS))
        spec = importlib.util.spec_from_file_location(
            f"backend_{name}", BACKEND_TESTS / f"{name}.py"
        )
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def tf_results(tmp_path_factory) -> Path:
    """TensorFlow's eager outputs of every case: the encoder cases by name, the attention
    cases as `attention:<case>:<output>`."""
    path = tmp_path_factory.mktemp("backends") / "tensorflow.npz"
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(BACKEND_TESTS))  # its `cases` and `attention_cases`
        np.savez(path, **_module("tensorflow_results").outputs())
    return path


@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_backend(backend, tf_results):
    pytest.importorskip(backend)
    environment = {
        **os.environ,
        "KERAS_BACKEND": backend,
        "POSENC_TF_RESULTS": str(tf_results),
        "TF_CPP_MIN_LOG_LEVEL": "2",
    }
    run = subprocess.run(
        [sys.executable, "-m", "pytest", str(BACKEND_TESTS), "-q", "-x", "-p", "no:cacheprovider"],
        cwd=TESTS.parent,
        env=environment,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-3000:]
    assert " passed" in run.stdout and " failed" not in run.stdout


@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_runs_without_tensorflow(backend):
    """Off TensorFlow the package imports none: every case runs with it made unimportable."""
    pytest.importorskip(backend)
    run = subprocess.run(
        [sys.executable, str(BACKEND_TESTS / "without_tensorflow.py")],
        cwd=TESTS.parent,
        env={**os.environ, "KERAS_BACKEND": backend},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-6000:]
    assert f"cases ran on {backend} without TensorFlow" in run.stdout
