"""The layers are written once; what differs between backends is `lazy.tricks()`'s.

`keras_posenc.backend.tensorflow` (TensorFlow) and `keras_posenc.backend.keras_ops` (JAX, PyTorch)
answer under the same names, module by module, and the modules every backend runs hold no
TensorFlow.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import re
from pathlib import Path

import pytest

from keras_posenc.backend import keras_ops as keras_ops_backend
from keras_posenc.backend import tensorflow as tf_backend

SUBMODULES = ("values", "tracing", "rows", "tables", "rotation", "attention")
# The modules every backend runs: the layers, their rows and tables.
SHARED = (
    "tables.positions",
    "tables.rows",
    "frequencies",
    "rope.scaling",
    "rope.registry",
    "tables.axes",
    "tables.rotary",
    "layers.sinusoidal",
    "layers.learned",
    "layers.rotary",
    "tables.host_constant",
    "layers.checks",
    "tables.layouts",
)


def _functions(module) -> set[str]:
    return {
        name
        for name, value in vars(module).items()
        if not name.startswith("_")
        and inspect.isfunction(value)
        and value.__module__ == module.__name__
    }


@pytest.mark.parametrize("submodule", SUBMODULES)
def test_tensorflow_answers_every_name_the_other_backends_do(submodule):
    ours = _functions(importlib.import_module(f"keras_posenc.backend.keras_ops.{submodule}"))
    theirs = _functions(importlib.import_module(f"keras_posenc.backend.tensorflow.{submodule}"))
    assert ours, submodule
    assert ours <= theirs, f"tf_backend.{submodule} lacks {sorted(ours - theirs)}"
    for name in ours:
        assert callable(getattr(keras_ops_backend, name)), name
        assert callable(getattr(tf_backend, name)), name


@pytest.mark.parametrize("module", SHARED)
def test_the_modules_every_backend_runs_reach_no_tensorflow(module):
    source = Path(importlib.util.find_spec(f"keras_posenc.{module}").origin).read_text()
    # Docstrings, comments and messages aside.
    code = re.sub(r'"""(?:.|\n)*?"""|#.*|"[^"\n]*"', "", source)
    assert not re.search(r"\b(tf|tf_backend|tensorflow)\.", code), module
    assert not re.search(r"import .*\b(tf|tf_backend|tensorflow)\b", code), module
