"""Dynamic NTK on JAX / PyTorch within 1e-6 of the float64 formula up to position 2^20.

Run by tests/test_backends.py in its process per backend (one start of JAX or PyTorch for
every backend test): each case of `dynamic_ntk_cases.py` eagerly and, on JAX, under
`jax.jit` with its start or positions traced (`dynamic_ntk_outputs.py`). TensorFlow's
eager, `tf.function` and XLA calls are held to the same bound in
tests/test_dynamic_ntk_exact.py.
"""

from __future__ import annotations

import keras
import numpy as np
from dynamic_ntk_cases import CASES, reference
from dynamic_ntk_outputs import outputs

BOUND = 1e-6  # the target, from the float64 formula


def test_within_1e6_of_float64():
    results = outputs()
    errors = {
        key: float(np.abs(value - reference(CASES[key.split(":", 1)[1]])).max())
        for key, value in results.items()
    }
    assert len(errors) == len(CASES) * (2 if keras.backend.backend() == "jax" else 1)
    assert max(errors.values()) <= BOUND, errors
