"""The `keras-posenc-export` front door: arguments first, then TensorFlow, quietly.

It lives outside the `keras_posenc` package because importing that package loads
TensorFlow (seconds, and hundreds of MB): here `--help` and argument errors are answered
without it, and TensorFlow's log level is set before it loads. The job itself is
`keras_posenc.export.job`.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Sequence

from keras_posenc_cli.quiet import filtered_stderr, is_noise

__all__ = ["filtered_stderr", "is_noise", "main", "quiet_environment"]


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
    """Parses the arguments, then runs `keras_posenc.export.job.run` quietly.

    Returns:
        The exit status: 0 when every verification passed (2 for a bad argument, from
        argparse, before TensorFlow is imported).
    """
    from keras_posenc_cli.arguments import parse_arguments

    arguments = parse_arguments(argv, prog)
    if arguments.debug:  # the converters' records, which the package logs at DEBUG
        logging.basicConfig(format="%(name)s: %(message)s")
        logging.getLogger("keras_posenc").setLevel(logging.DEBUG)
    quiet = not arguments.debug and quiet_environment()
    os.environ.setdefault("KERAS_BACKEND", "tensorflow")
    context = filtered_stderr() if quiet else contextlib.nullcontext()
    with context:
        from keras_posenc.export.job import run

        return run(arguments)


if __name__ == "__main__":
    raise SystemExit(main())
