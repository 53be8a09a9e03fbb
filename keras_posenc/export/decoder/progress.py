"""`save_decoder`'s progress on stderr: each phase, and the layers of the long ones.

Quiet with `verbose=0`, as Keras's `fit`. A layer line is printed at most every
`INTERVAL` seconds (and for the last layer), so a log holds a few lines per phase.
"""

from __future__ import annotations

import contextlib
import contextvars
import sys
import time
from collections.abc import Iterator

INTERVAL = 2.0

_CURRENT: contextvars.ContextVar[Progress | None] = contextvars.ContextVar(
    "keras_posenc_progress", default=None
)


class Progress:
    """Prints `save_decoder: PHASE` lines and `layer i of n` within a phase."""

    def __init__(self, verbose: int = 1, stream=None):
        self.verbose = int(verbose)
        self.stream = stream
        self._start = time.perf_counter()
        self._phase = None
        self._printed = 0.0

    def _print(self, line: str) -> None:
        stream = self.stream or sys.stderr
        stream.write(f"save_decoder [{time.perf_counter() - self._start:7.1f} s] {line}\n")
        stream.flush()

    def phase(self, name: str) -> Progress:
        """Starts phase `name`; returns `self`."""
        self._phase = name
        if self.verbose:
            self._print(name)
            self._printed = time.perf_counter()
        return self

    def layer(self, i: int, n: int) -> None:
        """Layer `i` (from 0) of `n` of the current phase is done."""
        now = time.perf_counter()
        if self.verbose and (i + 1 == n or now - self._printed >= INTERVAL):
            self._print(f"{self._phase}: layer {i + 1} of {n}")
            self._printed = now


@contextlib.contextmanager
def reporting(progress: Progress) -> Iterator[Progress]:
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
