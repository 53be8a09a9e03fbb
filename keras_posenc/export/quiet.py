"""The converters' own log lines, kept out of an export's output.

tf2onnx logs each op it leaves unconverted at ERROR (the exact gelu's `Erfc`, which the
package then replaces itself) and its progress at INFO; TensorFlow's LiteRT converter
writes glog lines to the process's stderr. None of it is news about a file that is then
checked and verified, and a real failure is the package's own error, naming the ops and
layers. So during a conversion their Python records go to the `keras_posenc.export`
logger at DEBUG, and TensorFlow's native lines are left out, unless that logger is
enabled for DEBUG (`logging.basicConfig(level="DEBUG")`, or the job's `--debug`): then
everything passes through as it was.
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Iterator

from keras_posenc_startup import filtered_stderr

LOGGER = logging.getLogger("keras_posenc.export")


class _Forward(logging.Handler):
    """Re-logs a converter's record to `LOGGER` at DEBUG, its origin in the message."""

    def emit(self, record: logging.LogRecord) -> None:
        LOGGER.debug("%s %s: %s", record.name, record.levelname, record.getMessage())


@contextlib.contextmanager
def converter_output(*logger_names: str) -> Iterator[None]:
    """Within the block, the named Python loggers and TensorFlow's native lines are quiet.

    Args:
        logger_names: the converters' loggers (`"tf2onnx"`, `"tensorflow"`, `"absl"`).
    """
    if LOGGER.isEnabledFor(logging.DEBUG):
        yield
        return
    loggers = [logging.getLogger(name) for name in logger_names]
    saved = [(logger.handlers, logger.propagate) for logger in loggers]
    forward = _Forward()
    for logger in loggers:
        logger.handlers, logger.propagate = [forward], False
    try:
        with filtered_stderr(), warnings.catch_warnings():
            warnings.filterwarnings("ignore", module="tf2onnx")
            yield
    finally:
        for logger, (handlers, propagate) in zip(loggers, saved, strict=True):
            logger.handlers, logger.propagate = handlers, propagate
