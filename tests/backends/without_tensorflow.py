"""Runs every backend case with TensorFlow made unimportable: the layers need none off TensorFlow.

`python tests/backends/without_tensorflow.py` under KERAS_BACKEND=jax or torch (started by
tests/test_backends.py). `sys.modules["tensorflow"] = None` makes `import tensorflow` fail
as on a machine without it; each case runs eagerly (and under `jax.jit` on JAX), and so
do the table helpers a user calls; any import of TensorFlow is an error with its traceback.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.modules["tensorflow"] = None  # `import tensorflow` now raises ImportError
sys.path.insert(0, str(Path(__file__).resolve().parent))

import cases  # noqa: E402
import keras  # noqa: E402
import numpy as np  # noqa: E402

import keras_posenc as kp  # noqa: E402


def main() -> None:
    for name in cases.CASES:
        output = cases.run(name)
        assert np.all(np.isfinite(output)), name
    if keras.backend.backend() == "jax":
        import jax

        for name, (_, _, _, call) in cases.CASES.items():
            layer = cases.build(name)
            traced = {k: v for k, v in call.items() if k in ("start_index", "positions")}
            static = {k: v for k, v in call.items() if k not in traced}
            jitted = jax.jit(
                lambda x, arguments, layer=layer, static=static: layer(x, **arguments, **static)
            )
            x = keras.ops.cast(cases.inputs(name), layer.compute_dtype)
            assert np.all(np.isfinite(np.asarray(jitted(x, traced), np.float32))), name
    dynamic = kp.RotaryEmbedding(scaling=cases.DYNAMIC)
    dynamic.build((1, 4, 1, 16))
    assert dynamic.inverse_frequencies(100).shape == (8,)
    learned = kp.LearnedPositionalEmbedding(10, embeddings_initializer="sinusoidal")
    learned.build((1, 4, 8))
    learned.resize(20)
    assert kp.sinusoidal_table(3, 4).shape == (3, 4)
    print(f"{len(cases.CASES)} cases ran on {keras.backend.backend()} without TensorFlow")


if __name__ == "__main__":
    main()
