"""Is `x + broadcast_to(rows, x.shape)` faster than the broadcasting add `x + rows`?

The question behind the rows where keras_hub is ahead: its additive layers hand TensorFlow
an add of two tensors of one shape (the rows broadcast first, by an op of their own or
folded into a constant), ours a broadcasting add. Run from the repository root:

    python -m benchmarks.broadcast_add [--rounds 30]

For several `(batch, sequence, width)` it times, in `tf.function` and eagerly, interleaved
in one process, the add with the rows broadcast by the add itself and broadcast first,
with the rows read from a variable (materialized every call) and as a constant (which
TensorFlow's graph optimizer may fold to a batch-sized one), and prints the ratios.
"""

from __future__ import annotations

import argparse
import os
import statistics

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from benchmarks.timing import Timed, run_rounds, warm_up  # noqa: E402

SHAPES = ((1, 16, 64), (4, 128, 256), (32, 128, 256), (8, 512, 512), (16, 512, 512))
MODES = ("function", "eager")


def _candidates(shape: tuple[int, ...], mode: str) -> dict[str, Timed]:
    rng = np.random.default_rng(0)
    sequence = shape[1]
    x = tf.constant(rng.uniform(-1, 1, shape).astype(np.float32))
    table = tf.Variable(rng.uniform(-1, 1, (sequence + 100, shape[2])).astype(np.float32))
    rows = rng.uniform(-1, 1, shape[1:]).astype(np.float32)
    full_shape = np.array(shape, np.int32)
    bodies = {
        "variable, broadcasting add": lambda: x + table[:sequence],
        "variable, broadcast first": lambda: x + tf.broadcast_to(table[:sequence], full_shape),
        "constant, broadcasting add": lambda: x + rows,
        "constant, broadcast first": lambda: x + tf.broadcast_to(rows, full_shape),
    }
    wrap = tf.function if mode == "function" else (lambda body: body)
    return {name: Timed(wrap(body)) for name, body in bodies.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    args = parser.parse_args()
    cases = [(shape, mode, _candidates(shape, mode)) for shape in SHAPES for mode in MODES]
    for _, _, candidates in cases:
        for timed in candidates.values():
            warm_up(timed, 0.005)
    run_rounds([list(c.values()) for _, _, c in cases], args.rounds, progress=False)
    print("| shape | mode | variable: first / broadcasting | constant: first / broadcasting |")
    print("|---|---|--:|--:|")
    for shape, mode, candidates in cases:
        median = {name: statistics.median(t.samples) for name, t in candidates.items()}
        variable = median["variable, broadcast first"] / median["variable, broadcasting add"]
        constant = median["constant, broadcast first"] / median["constant, broadcasting add"]
        print(f"| {shape} | {mode} | {variable:.2f} | {constant:.2f} |")


if __name__ == "__main__":
    main()
