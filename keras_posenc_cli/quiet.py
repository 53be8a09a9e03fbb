"""TensorFlow's native log lines left out of stderr: for the job, and for the package's converters.

TensorFlow's C++ code writes to the process's stderr directly, where Python's `logging` and
`warnings` cannot filter it; so the file descriptor is redirected for the length of a
block and what was written is passed on without the noise. TensorFlow-free, so that the
job can use it around TensorFlow's own start-up.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
from collections.abc import Iterator

# TensorFlow's start-up lines on a CPU machine: the absl preamble, INFO/WARNING lines of
# its C++ logger (oneDNN, CPU features, "could not find cuda drivers"), the cuInit error
# of a CUDA build without a GPU, LiteRT's XNNPACK notice, and the converter's diagnostics.
_NOISE = re.compile(
    r"^(WARNING: All log messages before absl::InitializeLog\(\) is called"
    r"|[IW]\d{4} \d\d:\d\d:\d\d"
    r"|E\d{4} \d\d:\d\d:\d\d.*\b(cuInit|cuda|CUDA|cuDNN|cuFFT|cuBLAS)\b"
    # The same lines as TensorFlow <= 2.20 writes them: "2025-01-31 12:00:00.123456: E ...".
    r"|\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+: [IW] "
    r"|\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+: E .*\b(cuInit|cuda|CUDA|cuDNN|cuFFT|cuBLAS)\b"
    r"|To enable the following instructions:"
    r"|INFO: Created TensorFlow Lite XNNPACK delegate"
    # The LiteRT converter's own diagnostics of a failed conversion: the job reports the
    # failure itself, with the ops and layers named.
    r"|loc\(callsite\(|loc\(fused\[|error: failed while converting: )"
)


def is_noise(line: str) -> bool:
    """Whether a line of stderr is TensorFlow's start-up noise."""
    return bool(_NOISE.match(line))


@contextlib.contextmanager
def filtered_stderr() -> Iterator[None]:
    """Sends what is written to stderr (by Python and by C++) through `is_noise`.

    The lines are held in a temporary file while the block runs and written to the real
    stderr, without the noise, when it ends (also when it raises).
    """
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as held:
        os.dup2(held.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            held.seek(0)
            text = held.read().decode(errors="replace")
            kept = [line for line in text.splitlines(keepends=True) if not is_noise(line)]
            if kept:
                sys.stderr.write("".join(kept))
                sys.stderr.flush()
