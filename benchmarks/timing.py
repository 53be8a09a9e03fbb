"""All candidates are built, then each is traced or compiled and called until one sample
lasts `--min-sample-ms` (5 ms). Each round times every candidate of every case once, a case's
candidates side by side, so that a slow spell of the shared machine falls on all of them
alike, in a fresh seeded random order each round, after one untimed round: a fixed order
would have each candidate always follow the same neighbour, which can leave the allocator or
the caches in a state that slows it every round. Python's garbage collector is off through
the rounds: steady-state calls make no cyclic garbage, and a collection slows the calls after
it, unevenly across candidates. Both effects were found with identical candidates as the
witness, which `control` keeps in every row. A call ends with `._numpy()` on its output (a
zero-copy view that waits for the value were TensorFlow to run the call asynchronously), and
drops it inside the timed region: each candidate pays for allocating and freeing its result,
as a real caller does (`benchmarks/timing.py`).
"""

from __future__ import annotations

import dataclasses
import gc
import math
import random
import sys
import time
from collections.abc import Callable

WARM_UP_CALLS = 3
MAX_REPEATS = 200


@dataclasses.dataclass
class Timed:
    """One candidate of one case: its call, repeats per sample, and per-call times (s)."""

    call: Callable
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
    """Traces or compiles the call, then sets `repeats` so a sample lasts `min_sample` (s)."""
    for _ in range(WARM_UP_CALLS):
        timed.call()._numpy()
    one_call = min(_one_sample(timed) for _ in range(3))
    timed.repeats = max(1, min(MAX_REPEATS, math.ceil(min_sample / max(one_call, 1e-7))))


def one_call(call: Callable, *args) -> float:
    """Seconds of a single call (for example the first with a new argument value)."""
    start = time.perf_counter()
    call(*args)._numpy()
    return time.perf_counter() - start


def run_rounds(
    groups: list[list[Timed]], rounds: int, progress: bool = True, seed: int = 0
) -> None:
    """Appends one sample per round to every `Timed`; a group is one case's candidates.

    A first, untimed round lets the process settle after the collection before it.
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
                elapsed = time.perf_counter() - began
                print(f"round {round_index + 1}/{rounds}: {elapsed:.1f} s", file=sys.stderr)
    finally:
        gc.enable()
