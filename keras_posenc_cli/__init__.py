"""The `keras-posenc-export` console script: TensorFlow's start-up quieted, then the job.

This module imports nothing heavy at its top: quieting TensorFlow has to happen before the
first `import keras` (which `import keras_posenc` does), so the script's entry point lives
outside the `keras_posenc` package. The job itself is `keras_posenc.export.cli`.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
from collections.abc import Iterator, Sequence

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


def quiet_environment() -> bool:
    """Sets the environment that quiets TensorFlow, unless the user set its log level.

    Returns:
        Whether the output should be filtered too (False: the user chose a level).
    """
    os.environ.setdefault("KERAS_BACKEND", "tensorflow")
    if "TF_CPP_MIN_LOG_LEVEL" in os.environ:
        return False
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
    return True


def main(argv: Sequence[str] | None = None, prog: str = "keras-posenc-export") -> int:
    """Runs `keras_posenc.export.cli.main` with TensorFlow's start-up noise left out."""
    quiet = quiet_environment()
    context = filtered_stderr() if quiet else contextlib.nullcontext()
    with context:
        from keras_posenc.export.cli import main as job

        return job(argv, prog)


if __name__ == "__main__":
    raise SystemExit(main())
