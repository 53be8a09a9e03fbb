"""A user's script that imports the package prints none of TensorFlow's start-up lines
(the absl preamble, oneDNN and CPU-feature notices, "could not find cuda drivers", the
cuInit error of a CUDA build without a GPU), and everything of its own."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from keras_posenc_startup import is_noise

REPOSITORY = Path(__file__).resolve().parents[1]
SCRIPT = """
import os, sys
import keras_posenc.export
import keras
keras.ops.convert_to_numpy(keras.ops.add(keras.ops.ones(2), 1.0))  # TensorFlow's devices start
print("level", os.environ.get("TF_CPP_MIN_LOG_LEVEL"))
print("tensorflow imported", "tensorflow" in sys.modules)
sys.stderr.write("the user's own line\\n")
raise ValueError("the user's own error")
"""


def _run(backend: str = "tensorflow", **environment) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    env.update(PYTHONPATH=str(REPOSITORY), KERAS_BACKEND=backend, **environment)
    return subprocess.run(
        [sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=300
    )


@pytest.mark.parametrize("backend", ["tensorflow", "jax"])
def test_a_script_importing_the_package_prints_no_tensorflow_start_up_lines(backend):
    # On JAX, the export path loads TensorFlow only for its TensorFlow entries.
    if backend == "jax":
        pytest.importorskip("jax", reason="the `test` extra's JAX, absent from `test-core`")
    result = _run(backend)
    noise = [line for line in result.stderr.splitlines() if is_noise(line)]
    assert noise == [], result.stderr
    if backend == "tensorflow":
        assert "level 2" in result.stdout  # set before TensorFlow loaded, as it was unset
    else:
        assert "tensorflow imported False" in result.stdout
    assert "the user's own line" in result.stderr
    assert "ValueError: the user's own error" in result.stderr


def test_a_log_level_the_user_set_is_theirs():
    result = _run(TF_CPP_MIN_LOG_LEVEL="0")
    assert "level 0" in result.stdout
    assert "ValueError: the user's own error" in result.stderr


def _stderr_of(script: str) -> str:
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    env.update(PYTHONPATH=str(REPOSITORY), KERAS_BACKEND="tensorflow")
    result = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr
    return result.stderr


def test_with_the_packages_logger_at_debug_everything_passes():
    """As the job's `--debug`: TensorFlow's own lines are what the user asked to see."""
    plain = _stderr_of("import tensorflow")
    if not any(is_noise(line) for line in plain.splitlines()):
        pytest.skip("this TensorFlow build prints no start-up lines to compare with")
    debug = _stderr_of(
        "import logging\nlogging.getLogger('keras_posenc').setLevel('DEBUG')\nimport keras_posenc\n"
    )
    assert any(is_noise(line) for line in debug.splitlines()), debug
