"""What `save_decoder` is doing, said on stderr as Keras's `fit` says its epochs.

`verbose=1` prints one line a phase (describing the model, writing the files, each
verification case and runtime, the float64 judge, replacing an earlier folder, the end),
each with the seconds since the call began; `verbose=0` prints nothing. The long phases
(describing a large model, again where the float64 judge needs it, and writing it) say
`layer i of n` at most every `INTERVAL` seconds, through the module's `phase` / `layer` /
`say`, which report to the `save_decoder` running (`reporting`).
"""

from __future__ import annotations

import contextlib
import contextvars
import operator
import os
import sys
import time
from collections.abc import Callable, Iterator

VERBOSE_CHOICES = (0, 1)
INTERVAL = 2.0


def check_verbose(verbose) -> int:
    """`verbose` as an int of `VERBOSE_CHOICES` (any integer type, bools too), or a ValueError."""
    try:
        value = operator.index(verbose)
    except TypeError:
        value = None
    if value in VERBOSE_CHOICES:
        return value
    raise ValueError(
        f"verbose must be 1 (say each phase on stderr) or 0 (say nothing), got {verbose!r}."
    )


class Progress:
    """Says `save_decoder`'s phases for `folder` on stderr (or nothing, `verbose=0`)."""

    def __init__(self, verbose: int, folder: str | os.PathLike):
        self.verbose = verbose
        self.folder = str(folder)
        self.began = time.perf_counter()
        self._phase = None
        self._said = 0.0

    def say(self, text: str) -> None:
        if self.verbose:
            seconds = time.perf_counter() - self.began
            print(
                f"save_decoder {self.folder} [{seconds:.1f} s]: {text}", file=sys.stderr, flush=True
            )

    def phase(self, name: str) -> None:
        """Says the start of phase `name`, whose layers `layer` then counts."""
        self._phase = name
        self.say(name)
        self._said = time.perf_counter()

    def layer(self, i: int, n: int) -> None:
        """Layer `i` (from 0) of `n` of the current phase is done: said for the last one,
        and otherwise at most every `INTERVAL` seconds."""
        now = time.perf_counter()
        if self.verbose and (i + 1 == n or now - self._said >= INTERVAL):
            self.say(f"{self._phase}: layer {i + 1} of {n}")
            self._said = now

    def cases(self, reference: Callable, runtimes: dict, count: int, reference_name: str):
        """`reference` and `runtimes` (greedy functions) that say each case as it runs:
        the reference is called first with each of the `count` cases' prompts, then the
        runtimes with the same arrays."""
        if not self.verbose:
            return reference, runtimes
        numbers = {}  # id of a case's prompts -> its number (they live through the cases)

        def said_reference(prompts, mask, steps):
            numbers[id(prompts)] = len(numbers) + 1
            self.say(
                f"verifying case {len(numbers)} of {count} (batch {len(prompts)}, prompt "
                f"{prompts.shape[1]}, {steps} steps): {reference_name}"
            )
            return reference(prompts, mask, steps)

        def said(name, run):
            def runtime(prompts, mask, steps):
                if id(prompts) in numbers:  # not a run again past a tie (judge.follow)
                    self.say(f"verifying case {numbers[id(prompts)]} of {count}: {name}")
                return run(prompts, mask, steps)

            return runtime

        return said_reference, {name: said(name, run) for name, run in runtimes.items()}


_CURRENT: contextvars.ContextVar[Progress | None] = contextvars.ContextVar(
    "keras_posenc_progress", default=None
)


@contextlib.contextmanager
def reporting(progress: Progress) -> Iterator[Progress]:
    """`progress` as the one `phase` and `layer` report to while the block runs."""
    token = _CURRENT.set(progress)
    try:
        yield progress
    finally:
        _CURRENT.reset(token)


def layer(i: int, n: int) -> None:
    """Reports layer `i` of `n` to the `save_decoder` running, if any."""
    progress = _CURRENT.get()
    if progress is not None:
        progress.layer(i, n)


def phase(name: str) -> None:
    """Reports the start of phase `name` to the `save_decoder` running, if any."""
    progress = _CURRENT.get()
    if progress is not None:
        progress.phase(name)


def say(text: str) -> None:
    """Says `text` for the `save_decoder` running, if any."""
    progress = _CURRENT.get()
    if progress is not None:
        progress.say(text)
