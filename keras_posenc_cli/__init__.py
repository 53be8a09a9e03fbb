"""The `keras-posenc-export` front door: arguments first, then TensorFlow, quietly.

It lives outside the `keras_posenc` package because importing that package loads
TensorFlow (seconds, and hundreds of MB): here `--help` and argument errors are answered
without it, and TensorFlow's log level is set before it loads. The job runs on
TensorFlow whatever `KERAS_BACKEND` says (`_on_tensorflow`). The job itself is
`keras_posenc_cli.job`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from keras_posenc_startup import filtered_stderr, is_noise

__all__ = ["filtered_stderr", "is_noise", "main", "quiet_environment"]


def quiet_environment() -> bool:
    """Sets the environment that quiets TensorFlow, unless the user set its log level.

    Returns:
        Whether the output should be filtered too (False: the user chose a level).
    """
    if "TF_CPP_MIN_LOG_LEVEL" in os.environ:
        return False
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
    return True


def main(argv: Sequence[str] | None = None, prog: str = "keras-posenc-export") -> int:
    """Parses the arguments, then runs `keras_posenc_cli.job.run` quietly.

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
    status = _on_tensorflow(argv, prog)
    if status is not None:
        return status
    context = filtered_stderr() if quiet else contextlib.nullcontext()
    with context:
        from keras_posenc_cli.job import run

        return run(arguments)


def _on_tensorflow(argv: Sequence[str] | None, prog: str) -> int | None:
    """Makes the job run on TensorFlow, whatever `KERAS_BACKEND` the shell exports: the
    SavedModel, tf2onnx and the LiteRT converter need it, and a `.keras` file saved on any
    backend loads there.

    Returns:
        None when this process runs the job (Keras not imported yet, or on TensorFlow);
        else the exit status of a fresh process that ran it (Keras fixes its backend when
        it is first imported, as in a session that imported it under JAX).
    """
    chosen = os.environ.get("KERAS_BACKEND", "tensorflow")
    os.environ["KERAS_BACKEND"] = "tensorflow"
    if chosen != "tensorflow":
        print(
            f"{prog}: exporting under TensorFlow (KERAS_BACKEND={chosen} is set): the "
            "SavedModel, ONNX and LiteRT exports need it; a .keras file saved on any "
            "backend loads here.",
            file=sys.stderr,
        )
    keras = sys.modules.get("keras")
    if keras is None or keras.backend.backend() == "tensorflow":
        return None
    here = str(Path(__file__).resolve().parents[1])  # keras_posenc_cli, for the child
    path = os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")]))
    code = "import sys, keras_posenc_cli as cli; sys.exit(cli.main(sys.argv[2:], sys.argv[1]))"
    arguments = list(sys.argv[1:] if argv is None else argv)
    child = subprocess.run(
        [sys.executable, "-c", code, prog, *arguments], env={**os.environ, "PYTHONPATH": path}
    )
    return child.returncode


if __name__ == "__main__":
    raise SystemExit(main())
