"""What runs before Keras and TensorFlow load: the backend Keras will load, and TensorFlow's
native log lines left out of stderr (for the package's own import, `quiet_tensorflow_start`;
its converters; and the export job, `keras_posenc_cli`).

A package of its own, beside `keras_posenc`, because `keras_posenc/__init__.py` imports Keras
and this must run before that: it imports neither Keras nor TensorFlow. The library and
the job's command line both import it; it imports neither of them.

TensorFlow's C++ code writes to the process's stderr directly, where Python's `logging` and
`warnings` cannot filter it; so the file descriptor is redirected for the length of a
block and what was written is passed on without the noise.
"""

from __future__ import annotations

import contextlib
import json
import logging
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


# Whether the user set TF_CPP_MIN_LOG_LEVEL: read when this module is first imported, which
# the package does before it imports Keras (JAX sets it to 1 on its import).
_USER_SET_LEVEL = "TF_CPP_MIN_LOG_LEVEL" in os.environ


def keras_backend_configured() -> str:
    """The backend Keras will load, read as Keras reads it (`KERAS_BACKEND`, else
    `$KERAS_HOME/keras.json` or `~/.keras/keras.json`, else TensorFlow), without importing it."""
    if os.environ.get("KERAS_BACKEND"):
        return os.environ["KERAS_BACKEND"]
    home = os.environ.get("KERAS_HOME") or os.path.join(os.path.expanduser("~"), ".keras")
    try:
        with open(os.path.join(home, "keras.json"), encoding="utf-8") as file:
            return str(json.load(file).get("backend", "tensorflow"))
    except (OSError, ValueError, AttributeError):
        return "tensorflow"


@contextlib.contextmanager
def quiet_tensorflow_start(loads_tensorflow: bool = True) -> Iterator[None]:
    """TensorFlow's start-up lines left out of stderr while the block (an import) runs.

    For a user's script that imports the package: unless the user set TF_CPP_MIN_LOG_LEVEL
    (their choice of TensorFlow's output, kept as it is) or TensorFlow is loaded already
    (its lines are out, and the user may have chosen its logging), it is set to 2 before TensorFlow
    loads (its INFO and WARNING lines), and stderr goes through `is_noise` while the block
    runs (the lines TensorFlow writes before its log level is read); TensorFlow's devices
    are listed inside it, so that a CUDA build's cuInit error on a machine without a GPU
    comes (and is left out) now rather than at the first op. Everything else written to
    stderr meanwhile is passed on when the block ends; nothing outside the block is
    filtered. TensorFlow-free: it does not import TensorFlow itself.

    Args:
        loads_tensorflow: whether the block may load TensorFlow (False: nothing is done).
    """
    # Without TensorFlow loading, nothing: JAX's XLA reads the same level. With the package's
    # logger at DEBUG (the job's --debug) everything passes, as in the converters' output.
    debug = logging.getLogger("keras_posenc").isEnabledFor(logging.DEBUG)
    if not loads_tensorflow or _USER_SET_LEVEL or debug or "tensorflow" in sys.modules:
        yield
        return
    try:
        os.fstat(2)
    except OSError:  # no stderr to filter (a windowed process)
        yield
        return
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
    with filtered_stderr():
        yield
        if "tensorflow" in sys.modules:
            sys.modules["tensorflow"].config.list_physical_devices()
