"""The package as a whole: exports, registration, docstring examples, the backend guard."""

from __future__ import annotations

import doctest
import importlib.metadata
import os
import subprocess
import sys

import keras
import numpy as np
import pytest

import keras_posenc

LAYERS = [
    "SinusoidalPositionalEncoding",
    "LearnedPositionalEmbedding",
    "RotaryEmbedding",
    "RotaryMultiHeadAttention",
    "RotaryGroupQueryAttention",
    "SinusoidalInitializer",
]


def test_exports():
    for name in keras_posenc.__all__:
        assert getattr(keras_posenc, name) is not None, name
    assert set(LAYERS) <= set(keras_posenc.__all__)


def test_version_matches_the_installed_distribution():
    assert keras_posenc.__version__ == importlib.metadata.version("keras-posenc")


@pytest.mark.parametrize("name", LAYERS)
def test_registered_for_keras_serialization(name):
    cls = getattr(keras_posenc, name)
    assert keras.saving.get_registered_name(cls) == f"keras_posenc>{name}"
    assert keras.saving.get_registered_object(f"keras_posenc>{name}") is cls


@pytest.mark.parametrize(
    "module",
    [
        "layers.sinusoidal",
        "layers.learned",
        "layers.rotary",
        "layers.rotary_attention",
        "layers.rotary_group_query_attention",
        "tables.axes",
        "configs.arguments",
        "configs.rope_per_layer",
        "layers.attention_temperature",
    ],
)
def test_docstring_examples_run(module):
    module = __import__(f"keras_posenc.{module}", fromlist=["_"])
    globs = {
        "np": np,
        "keras": keras,
        **{n: getattr(keras_posenc, n) for n in keras_posenc.__all__},
        **{n: getattr(module, n) for n in dir(module) if not n.startswith("_")},
    }
    finder = doctest.DocTestFinder()
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    for test in finder.find(module, globs=globs):
        runner.run(test)
    results = runner.summarize(verbose=False)
    assert results.attempted > 0 and results.failed == 0


def _import_in_a_subprocess(code: str, backend: str) -> subprocess.CompletedProcess:
    environment = dict(os.environ, KERAS_BACKEND=backend, TF_CPP_MIN_LOG_LEVEL="3")
    return subprocess.run(
        [sys.executable, "-c", code],
        env=environment,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_another_backend_is_an_import_error_that_says_what_to_set():
    # numpy is the backend every Keras installation ships.
    result = _import_in_a_subprocess(
        "try:\n"
        "    import keras_posenc\n"
        "except ImportError as error:\n"
        "    print('ImportError:', error)\n"
        "else:\n"
        "    print('imported')\n",
        backend="numpy",
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("ImportError:"), result.stdout
    assert "KERAS_BACKEND=tensorflow" in result.stdout, result.stdout


def test_the_guard_names_the_backend_keras_runs_on():
    # Keras itself imported on the tensorflow backend, then made to report another one
    # (numpy: the package runs on tensorflow, jax and torch): the package's own check,
    # independent of which backends this machine can import.
    result = _import_in_a_subprocess(
        "import keras\n"
        "keras.backend.backend = lambda: 'numpy'\n"
        "try:\n"
        "    import keras_posenc\n"
        "except ImportError as error:\n"
        "    print('ImportError:', error)\n",
        backend="tensorflow",
    )
    assert result.returncode == 0, result.stderr
    assert "ImportError:" in result.stdout and "'numpy'" in result.stdout, result.stdout
    assert "KERAS_BACKEND=tensorflow" in result.stdout, result.stdout
