"""How it is timed: warm-up, then interleaved rounds in a random order.

TensorFlow on CPU runs eager ops and `tf.function` calls synchronously: a call returns
when its output is computed. Each timed call still ends with `._numpy()` on the output,
a zero-copy view (about 1 µs) that would wait for the value if execution were
asynchronous. The output is dropped inside the timed region, so every candidate pays
for allocating and freeing its result, as a real caller would.

Each round times every candidate of every case once; a case's candidates run next to
each other, so that a slow spell of the (shared) machine falls on all of them alike, in
a fresh random order each round (seeded). A fixed rotation would leave every candidate
always following the same neighbour: one that leaves the caches or the allocator in a
bad state then slows the same candidate every round (by 14% in a test of identical
candidates). Calls faster than `min_sample` are repeated within a sample, and the sample
divided by the repeats.

Python's garbage collector stays off through the rounds. Calls in a steady state make
no cyclic garbage (none over 6000 calls of three layers, checked), and on this VM a
collection (of the ~300k objects TensorFlow and Keras leave tracked) makes the next few
dozen calls 1.5-2x slower, unevenly across candidates: collecting between rounds put
identical candidates 10-15% apart and every time 1.7x too high.
"""

from __future__ import annotations

import dataclasses
import gc
import math
import random
import sys
import time
from collections.abc import Callable

import tensorflow as tf

WARM_UP_CALLS = 3
MAX_REPEATS = 200


@dataclasses.dataclass
class Timed:
    """One candidate of one case: its call, repeats per sample, and per-call times (s)."""

    call: Callable[..., tf.Tensor]
    repeats: int = 1
    samples: list[float] = dataclasses.field(default_factory=list)
    new_start: float | None = None  # seconds of the first call with another start value
    new_start_again: float | None = None  # and of the next call with that same value


def _one_sample(timed: Timed) -> float:
    call = timed.call
    start = time.perf_counter()
    for _ in range(timed.repeats):
        call()._numpy()
    return (time.perf_counter() - start) / timed.repeats


def warm_up(timed: Timed, min_sample: float) -> None:
    """Traces or compiles the call, then sets `repeats` so a sample lasts `min_sample`."""
    for _ in range(WARM_UP_CALLS):
        timed.call()._numpy()
    one_call = min(_one_sample(timed) for _ in range(3))
    timed.repeats = max(1, min(MAX_REPEATS, math.ceil(min_sample / max(one_call, 1e-7))))


def one_call(call: Callable[..., tf.Tensor], *args) -> float:
    """Seconds of a single call (for example the first with a new argument value)."""
    start = time.perf_counter()
    call(*args)._numpy()
    return time.perf_counter() - start


def run_rounds(
    groups: list[list[Timed]], rounds: int, progress: bool = True, seed: int = 0
) -> None:
    """Appends one sample per round to every `Timed`; `groups` are a case's candidates.

    A first, untimed round lets the process settle after the one collection before it.
    """
    shuffler = random.Random(seed)
    gc.collect()
    gc.disable()
    try:
        for round_index in range(-1, rounds):
            began = time.perf_counter()
            for group in groups:
                for timed in shuffler.sample(group, len(group)):
                    sample = _one_sample(timed)
                    if round_index >= 0:
                        timed.samples.append(sample)
            if progress and round_index >= 0:
                print(
                    f"round {round_index + 1}/{rounds}: {time.perf_counter() - began:.1f} s",
                    file=sys.stderr,
                    flush=True,
                )
    finally:
        gc.enable()
