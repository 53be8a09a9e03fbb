"""The layers are written once; what differs between backends is `_lazy.tricks()`'s.

`keras_posenc._tf` (TensorFlow) and `keras_posenc._keras_ops` (JAX, PyTorch) answer under
the same names, module by module, and the modules every backend runs hold no TensorFlow.
"""

from __future__ import annotations

import importlib
import inspect
import re
from pathlib import Path

import pytest

import keras_posenc
from keras_posenc import _keras_ops, _tf

SUBMODULES = ("values", "tracing", "rows", "tables", "rotation", "attention")
# The modules every backend runs: the layers, their rows and tables.
SHARED = (
    "positions",
    "rows",
    "frequencies",
    "rope_scaling",
    "axes",
    "rotary_tables",
    "sinusoidal",
    "learned",
    "rotary",
    "_host_constant",
    "_checks",
    "layouts",
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
    ours = _functions(importlib.import_module(f"keras_posenc._keras_ops.{submodule}"))
    theirs = _functions(importlib.import_module(f"keras_posenc._tf.{submodule}"))
    assert ours, submodule
    assert ours <= theirs, f"_tf.{submodule} lacks {sorted(ours - theirs)}"
    for name in ours:
        assert callable(getattr(_keras_ops, name)), name
        assert callable(getattr(_tf, name)), name


@pytest.mark.parametrize("module", SHARED)
def test_the_modules_every_backend_runs_reach_no_tensorflow(module):
    source = (Path(keras_posenc.__file__).parent / f"{module}.py").read_text()
    # Docstrings, comments and messages aside.
    code = re.sub(r'"""(?:.|\n)*?"""|#.*|"[^"\n]*"', "", source)
    assert not re.search(r"\b(tf|_tf|tensorflow)\.", code), module
    assert not re.search(r"import .*\b(tf|_tf|tensorflow)\b", code), module
