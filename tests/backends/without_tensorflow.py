"""Runs the backend cases and checks that nothing imported TensorFlow: off TensorFlow the
package needs none, and none starts (to claim a GPU beside JAX or PyTorch) where installed.

`python tests/backends/without_tensorflow.py` under KERAS_BACKEND=jax or torch (started by
tests/test_backends.py), with TensorFlow installed: each encoder case runs eagerly (and
under `jax.jit` on JAX), and so do the table helpers a user calls; so do attention cases
(`ATTENTION_CASES`): grouped-query attention without a cache, multi-head attention
decoding into a cache (eagerly, and on JAX also under `jax.jit` with the index traced) and
a `decoder_models` step. Then `tensorflow` must not be in `sys.modules`; the error shows
where it was first imported. (Keras itself imports TensorFlow, where installed, when it
serializes an object, as in `model.save`: not done here.)
"""

from __future__ import annotations

import sys
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


class _FirstImport:
    """A finder that finds nothing and keeps the stack of the first search for TensorFlow
    (torch's dynamo only looks it up, without importing it)."""

    stack = None

    def find_spec(self, name, path=None, target=None):
        if name == "tensorflow" and self.stack is None:
            frames = [f for f in traceback.extract_stack()[:-1] if "<frozen" not in f.filename]
            if not any("_dynamo" in frame.filename for frame in frames):
                self.stack = "".join(traceback.format_list(frames[-10:]))


first_import = _FirstImport()
sys.meta_path.insert(0, first_import)

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
    assert "tensorflow" not in sys.modules, f"TensorFlow was imported:\n{first_import.stack}"
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
