"""What `save_decoder` is doing, said on stderr as Keras's `fit` says its epochs.

`verbose=1` prints one line a phase (describing the model, writing the files, each
verification case and runtime, replacing an earlier folder, the end), each with the
seconds since the call began; `verbose=0` prints nothing. Other phases (reading weights
in parts, streaming large files) add their own lines through `Progress.say`.
"""

from __future__ import annotations

import operator
import os
import sys
import time
from collections.abc import Callable

VERBOSE_CHOICES = (0, 1)


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

    def say(self, text: str) -> None:
        if self.verbose:
            seconds = time.perf_counter() - self.began
            print(
                f"save_decoder {self.folder} [{seconds:.1f} s]: {text}", file=sys.stderr, flush=True
            )

    def cases(self, reference: Callable, runtimes: dict, count: int, reference_name: str):
        """`reference` and `runtimes` (greedy functions) that say each case as it runs:
        the reference is called first in each of the `count` cases, then each runtime."""
        if not self.verbose:
            return reference, runtimes
        case = [0]

        def said_reference(prompts, mask, steps):
            case[0] += 1
            self.say(
                f"verifying case {case[0]} of {count} (batch {len(prompts)}, prompt "
                f"{prompts.shape[1]}, {steps} steps): {reference_name}"
            )
            return reference(prompts, mask, steps)

        def said(name, run):
            def runtime(prompts, mask, steps):
                self.say(f"verifying case {case[0]} of {count}: {name}")
                return run(prompts, mask, steps)

            return runtime

        return said_reference, {name: said(name, run) for name, run in runtimes.items()}
