"""Dynamic NTK RoPE's graph time past its switch, for a before/after comparison.

    PYTHONPATH=. python benchmarks/dynamic_ntk_speed.py                 # this checkout
    PYTHONPATH=/other/checkout python benchmarks/dynamic_ntk_speed.py   # another one

Times `RotaryEmbedding(scaling=dynamic)` in `tf.function` and under XLA with a run-time
`start_index`, a prefill of 4096 tokens and one decode step, (batch, sequence, 8 heads,
128), ending past `max_position_embeddings` and at or below it. Prints median
milliseconds per call; run two checkouts alternately on the same machine to compare.
"""

from __future__ import annotations

import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import keras_posenc as kp  # noqa: E402

# name: (batch, sequence, heads, dim, start_index, max_position_embeddings); "past" cases
# end beyond max_position_embeddings (the frequencies change), "below" ones do not.
CASES = {
    "prefill 4096 past": (1, 4096, 8, 128, 10_000, 2048),
    "decode 1 past": (1, 1, 8, 128, 100_000, 2048),
    "prefill 4096 below": (1, 4096, 8, 128, 0, 8192),
    "decode 1 below": (1, 1, 8, 128, 1000, 8192),
}


def _median_ms(call, rounds: int = 30) -> float:
    call()
    samples = []
    for _ in range(rounds):
        start = time.perf_counter()
        call()
        samples.append(time.perf_counter() - start)
    return 1e3 * float(np.median(samples))


def main() -> None:
    print(f"keras_posenc from {os.path.dirname(kp.__file__)}")
    for name, (batch, sequence, heads, dim, first, switch) in CASES.items():
        scaling = {"rope_type": "dynamic", "factor": 4.0, "max_position_embeddings": switch}
        layer = kp.RotaryEmbedding(layout="half", scaling=scaling)
        x = tf.constant(
            np.random.default_rng(0).standard_normal((batch, sequence, heads, dim)), tf.float32
        )
        start = tf.constant(first, tf.int32)
        for mode, jit in (("tf.function", False), ("xla", True)):
            run = tf.function(lambda x, s, layer=layer: layer(x, start_index=s), jit_compile=jit)
            milliseconds = _median_ms(lambda run=run, x=x, start=start: run(x, start))
            print(f"{name:>18} {mode:>11}: {milliseconds:8.3f} ms")


if __name__ == "__main__":
    main()
