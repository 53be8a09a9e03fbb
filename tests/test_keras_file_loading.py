"""`.keras` files loaded in a fresh process that has not imported keras_posenc.

Keras resolves a saved layer by its `registered_name` (`keras_posenc>Name`), which only exists
once `import keras_posenc` has run the registration decorators. Failing that, Keras < 3.9 imports
the file's `module` (`keras_posenc.layers.sinusoidal`, ...) itself; Keras >= 3.9 (the fix of
CVE-2025-1550) imports only `keras`, `keras_hub`, `keras_cv` and `keras_nlp` modules and raises a
`TypeError` that names the class, its `module` and says to import it.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import keras
import numpy as np
from packaging.version import Version

from keras_posenc import (
    LearnedPositionalEmbedding,
    RotaryEmbedding,
    RotaryMultiHeadAttention,
    SinusoidalPositionalEncoding,
)

REPOSITORY = Path(__file__).resolve().parents[1]

FRESH_PROCESS = """
import json, sys
import keras, numpy as np

path, inputs, outputs = sys.argv[1:4]
result = {}
try:
    keras.models.load_model(path)
    result["error_without_import"] = None
except Exception as error:
    result["error_without_import"] = f"{type(error).__name__}: {error}"
result["imported_by_keras"] = "keras_posenc" in sys.modules

import keras_posenc  # noqa: F401  (the fix the error must point at)

np.save(outputs, keras.models.load_model(path)(np.load(inputs)))
print("RESULT " + json.dumps(result))
"""


def _model() -> keras.Model:
    inputs = keras.Input((None, 16))
    x = SinusoidalPositionalEncoding()(inputs)
    x = LearnedPositionalEmbedding(32, embeddings_initializer="sinusoidal")(x)
    x = RotaryMultiHeadAttention(num_heads=2, key_dim=8)(x, x, use_causal_mask=True)
    x = keras.layers.Reshape((-1, 2, 8))(x)
    outputs = RotaryEmbedding(layout="interleaved")(x)
    return keras.Model(inputs, outputs)


def _registered(config):
    """Every serialized object of the package in a `.keras` config, nested ones included."""
    if isinstance(config, dict):
        if str(config.get("registered_name", "")).startswith("keras_posenc>"):
            yield config
        for value in config.values():
            yield from _registered(value)
    elif isinstance(config, list):
        for value in config:
            yield from _registered(value)


def test_saved_modules_are_importable_and_hold_the_registered_class(tmp_path):
    path = tmp_path / "model.keras"
    _model().save(path)
    config = json.loads(zipfile.ZipFile(path).read("config.json"))
    saved = list(_registered(config))
    names = {entry["class_name"] for entry in saved}
    assert names == {
        "SinusoidalPositionalEncoding",
        "LearnedPositionalEmbedding",
        "SinusoidalInitializer",
        "RotaryMultiHeadAttention",
        "RotaryEmbedding",
    }
    for entry in saved:
        # The module a user (or Keras < 3.9) imports from the file leads to the same class.
        assert entry["module"].startswith("keras_posenc."), entry["module"]
        module = importlib.import_module(entry["module"])
        registered = keras.saving.get_registered_object(entry["registered_name"])
        assert getattr(module, entry["class_name"]) is registered


def test_loading_in_a_fresh_process_without_the_import(tmp_path):
    model = _model()
    path = tmp_path / "model.keras"
    model.save(path)
    x = np.random.default_rng(0).normal(size=(2, 7, 16)).astype("float32")
    np.save(tmp_path / "inputs.npy", x)
    env = {
        **os.environ,
        "KERAS_BACKEND": keras.backend.backend(),  # the computation compared exactly below
        "TF_CPP_MIN_LOG_LEVEL": "3",
        "PYTHONPATH": os.pathsep.join([str(REPOSITORY), os.environ.get("PYTHONPATH", "")]),
    }
    run = subprocess.run(
        [sys.executable, "-c", FRESH_PROCESS, path, tmp_path / "inputs.npy", tmp_path / "y.npy"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    lines = [line for line in run.stdout.splitlines() if line.startswith("RESULT ")]
    assert run.returncode == 0 and lines, run.stdout[-3000:] + run.stderr[-3000:]
    result = json.loads(lines[-1][len("RESULT ") :])
    error = result["error_without_import"]

    if Version(keras.__version__) >= Version("3.9"):
        assert result["imported_by_keras"] is False
        assert error is not None and error.startswith("TypeError")
        # what points the user at the fix: the class, the package's module, "imported"
        assert "Could not locate class 'SinusoidalPositionalEncoding'" in error, error
        assert "'module': 'keras_posenc.layers.sinusoidal'" in error, error
        assert "'registered_name': 'keras_posenc>SinusoidalPositionalEncoding'" in error
        assert "make sure they are all imported" in error
    else:
        assert result["imported_by_keras"] is True
        assert error is None

    # after `import keras_posenc` the file loads and computes what the saved model computed:
    # the same layers, weights, backend and inputs, so the same float32 numbers exactly
    np.testing.assert_array_equal(np.load(tmp_path / "y.npy"), np.asarray(model(x)))
