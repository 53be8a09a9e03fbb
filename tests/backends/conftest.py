"""The backend tests run in their own process under KERAS_BACKEND=jax or torch
(tests/test_backends.py starts them); collected under TensorFlow they are skipped."""

from __future__ import annotations

import os


def pytest_ignore_collect(collection_path, config):
    if os.environ.get("KERAS_BACKEND", "tensorflow") == "tensorflow":
        return collection_path.name.startswith("test_")
    return None
