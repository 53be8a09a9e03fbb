"""Dynamic NTK RoPE's graph time against its pre-exact version, interleaved in one process.

    PYTHONPATH=. python benchmarks/dynamic_ntk_speed.py [--rounds 40]

Times `RotaryEmbedding(scaling=dynamic)` in `tf.function` and under XLA with a run-time
`start_index`, a prefill of 4096 tokens and one decode step, (batch, sequence, 8 heads,
128), ending past `max_position_embeddings` and at or below it. Three candidates per case:

- `this`: the layer as it is;
- `pre-exact`: the same layer with its dynamic rows made as before they were exact (main at
  d26007e: float32 frequencies `ω·exp(-e·log g)` and the four-product fixed-point rotation,
  copied below), everything else shared;
- `control`: a second `this`, the witness of the machine's noise (its ratio to `this`
  should be 1).

Every round times each candidate once, in a fresh random order (`benchmarks.timing`).
Prints each candidate's median milliseconds per call and the ratio of medians to
`pre-exact`.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import keras_posenc as kp  # noqa: E402
from benchmarks.timing import Timed, run_rounds, warm_up  # noqa: E402
from keras_posenc.rotary_tables import channel_tables  # noqa: E402

# name: (batch, sequence, heads, dim, start_index, max_position_embeddings); "past" cases
# end beyond max_position_embeddings (the frequencies change), "below" ones do not.
CASES = {
    "prefill 4096 past": (1, 4096, 8, 128, 10_000, 2048),
    "decode 1 past": (1, 1, 8, 128, 100_000, 2048),
    "prefill 4096 below": (1, 4096, 8, 128, 0, 8192),
    "decode 1 below": (1, 1, 8, 128, 1000, 8192),
}
_TURN = 2**31


def _pre_exact_turns(total_length, omega, factor: float, switch: int):
    """d26007e's `dynamic_turns`: float32 `ω'/2π` for a run-time total length."""
    dim = 2 * len(omega)
    exponents = np.arange(0, dim, 2, dtype=np.float64) / (dim - 2)
    length = tf.maximum(tf.cast(total_length, tf.float32), float(switch))
    growth = factor * length / float(switch) - (factor - 1.0)
    correction = tf.exp(-exponents.astype(np.float32) * tf.math.log(growth))
    return (omega / (2 * math.pi)).astype(np.float32) * correction


def _pre_exact_sin_cos(positions, turns):
    """d26007e's `exact_sin_cos`: four exact products of 12-bit halves, fixed-point sum."""
    scaled = turns * 4097.0
    turns_high = scaled - (scaled - turns)
    turns_low = turns - turns_high
    positions = tf.expand_dims(tf.cast(positions, tf.int32), -1)
    position_low = positions % 4096
    position_high = tf.cast(positions - position_low, tf.float32)
    position_low = tf.cast(position_low, tf.float32)
    fixed = tf.zeros([], tf.int64)
    for position_part in (position_high, position_low):
        for turns_part in (turns_high, turns_low):
            product = position_part * turns_part
            fraction = product - tf.round(product)
            fixed += tf.cast(tf.round(fraction * _TURN), tf.int64)
    half = _TURN // 2
    wrapped = tf.math.floormod(fixed + half, _TURN) - half
    angle = tf.cast(wrapped, tf.float32) * np.float32(2.0 * np.pi / _TURN)
    return tf.sin(angle), tf.cos(angle)


class PreExactRows:
    """d26007e's `DynamicRows` (its `slice` and `gather`, the same as today's)."""

    def __init__(self, omega, factor: float, switch: int, layout: str):
        self.omega, self.factor, self.switch, self.layout = omega, factor, switch, layout

    def slice(self, start, length, combine=lambda *rows: rows, traced=None):
        positions = tf.range(length) + start
        return combine(*self._rows(positions, start + length))

    def gather(self, positions):
        return self._rows(positions, tf.reduce_max(positions) + 1)

    def _rows(self, positions, total_length):
        turns = _pre_exact_turns(total_length, self.omega, self.factor, self.switch)
        return channel_tables(self.layout, *_pre_exact_sin_cos(positions, turns))


def _layer(scaling: dict, x, pre_exact: bool):
    layer = kp.RotaryEmbedding(layout="half", scaling=scaling)
    layer.build(x.shape)
    if pre_exact:
        omega = layer.inverse_frequencies()
        # The layer's choice between its table and its dynamic rows (`SwitchByLength`):
        # only the dynamic rows are replaced.
        switch = scaling["max_position_embeddings"]
        layer._table.long = PreExactRows(omega, scaling["factor"], switch, "half")
    return layer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--min-sample-ms", type=float, default=5.0)
    args = parser.parse_args()
    print(f"keras_posenc from {os.path.dirname(kp.__file__)}")
    groups, names = [], []
    for name, (batch, sequence, heads, dim, first, switch) in CASES.items():
        scaling = {"rope_type": "dynamic", "factor": 4.0, "max_position_embeddings": switch}
        x = tf.constant(
            np.random.default_rng(0).standard_normal((batch, sequence, heads, dim)), tf.float32
        )
        start = tf.constant(first, tf.int32)
        for mode, jit in (("tf.function", False), ("XLA", True)):
            group = {}
            for candidate in ("this", "pre-exact", "control"):
                layer = _layer(scaling, x, candidate == "pre-exact")
                run = tf.function(
                    lambda x, s, layer=layer: layer(x, start_index=s), jit_compile=jit
                )
                group[candidate] = Timed(lambda run=run, x=x, start=start: run(x, start))
                warm_up(group[candidate], args.min_sample_ms / 1e3)
            groups.append(group)
            names.append(f"{name}, {mode}")
    run_rounds([list(group.values()) for group in groups], args.rounds, progress=False)
    print("| case | pre-exact ms | this ms | control ms | this / pre-exact | control / this |")
    print("|--|--:|--:|--:|--:|--:|")
    for name, group in zip(names, groups, strict=True):
        ms = {key: 1e3 * statistics.median(timed.samples) for key, timed in group.items()}
        print(
            f"| {name} | {ms['pre-exact']:.3f} | {ms['this']:.3f} | {ms['control']:.3f} "
            f"| {ms['this'] / ms['pre-exact']:.2f} | {ms['control'] / ms['this']:.2f} |"
        )


if __name__ == "__main__":
    main()
