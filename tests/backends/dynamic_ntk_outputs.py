"""Dynamic NTK's outputs on this process's backend, eagerly and under its compiler.

Called by tests/backends/test_dynamic_ntk.py under KERAS_BACKEND=jax or torch;
`python dynamic_ntk_outputs.py OUT.npz` writes them to a file. Per case of
`dynamic_ntk_cases.CASES`: the layer's output eagerly (`eager:<name>`) and, on JAX, under
`jax.jit` with a traced start or traced positions (`jit:<name>`).
"""

from __future__ import annotations

import sys

import keras
import numpy as np
from dynamic_ntk_cases import CASES, inputs

import keras_posenc as kp


def outputs() -> dict[str, np.ndarray]:
    results = {}
    for name, case in CASES.items():
        layer = kp.RotaryEmbedding(layout="half", scaling=case["scaling"])
        x = inputs(case)
        if "start" in case:
            results[f"eager:{name}"] = layer(x, start_index=case["start"])
        else:
            results[f"eager:{name}"] = layer(x, positions=case["positions"])
        if keras.backend.backend() == "jax":
            import jax

            if "start" in case:
                run = jax.jit(lambda x, s, layer=layer: layer(x, start_index=s))
                results[f"jit:{name}"] = run(x, np.int32(case["start"]))
            else:
                run = jax.jit(lambda x, p, layer=layer: layer(x, positions=p))
                results[f"jit:{name}"] = run(x, case["positions"])
    return {k: keras.ops.convert_to_numpy(v) for k, v in results.items()}


if __name__ == "__main__":
    np.savez(sys.argv[1], **outputs())
