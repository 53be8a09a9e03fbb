"""Runs the backend cases with TensorFlow made unimportable: the layers need none off TensorFlow.

`python tests/backends/without_tensorflow.py` under KERAS_BACKEND=jax or torch (started by
tests/test_backends.py). `sys.modules["tensorflow"] = None` makes `import tensorflow` fail
as on a machine without it; each encoder case runs eagerly (and under `jax.jit` on JAX),
and so do the table helpers a user calls; so do attention cases (`ATTENTION_CASES`):
grouped-query attention without a cache, multi-head attention decoding into a cache
(eagerly, and on JAX also under `jax.jit` with the index traced) and a `decoder_models`
step. Any import of TensorFlow is an error with its traceback.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.modules["tensorflow"] = None  # `import tensorflow` now raises ImportError
sys.path.insert(0, str(Path(__file__).resolve().parent))

import attention_cases  # noqa: E402
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
    on_jax = keras.backend.backend() == "jax"
    for name, jax_modes in ATTENTION_CASES.items():
        for jit in jax_modes if on_jax else (False,):
            for output in attention_cases.run(name, jit=jit).values():
                assert np.all(np.isfinite(output)), name
    print(
        f"{len(cases.CASES)} cases and {len(ATTENTION_CASES)} attention cases ran on "
        f"{keras.backend.backend()} without TensorFlow"
    )


# Grouped-query attention without a cache, multi-head attention decoding into a cache, the
# decoder: each eagerly; on JAX, where eager calls compile every op, the decode eagerly and
# jitted, the others jitted.
ATTENTION_CASES = {
    "gqa_padded_chunked_tempered_l2": (True,),
    "mha_cache_window_gate_yarn_gemma_norm": (False, True),
    "decoder": (True,),
}


if __name__ == "__main__":
    main()
