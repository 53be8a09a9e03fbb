"""The export job's arguments, parsed and checked before anything imports TensorFlow.

The defaults are the package's own (`keras_posenc.export`: `BATCH_SIZES`, `SEQUENCE_LENGTHS`,
`DEFAULT_OPSET`, `SUPPORTED_OPSETS`, `DEFAULT_ENCODERS`; `frequencies.MAX_POSITIONS`), written
here as plain values because importing the package would load TensorFlow;
`tests/test_export_cli.py` holds them equal.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

ENCODERS = ("sinusoidal", "learned", "rotary")
BATCH_SIZES = (1, 2, 3, 8)
SEQUENCE_LENGTHS = (1, 2, 17, 128, 511)
DEFAULT_OPSET = 17
SUPPORTED_OPSETS = (13, 14, 15, 16, 17, 18, 23)
REPEATS = 7
MAX_POSITIONS = 2**24  # the positions any file serves: [0, 2^24)
LARGEST_AXIS = 2**31 - 1  # int32 shapes (TFLite's, and TensorFlow's kernels')

# In a checkout the artifacts go where they always went, export/artifacts; elsewhere (an
# installed package) into the current folder.
CHECKOUT = Path(__file__).resolve().parents[1]
CHECKOUT_ARTIFACTS = CHECKOUT / "export" / "artifacts"
ARTIFACTS_NAME = "keras-posenc-artifacts"


def _positive_integers(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(part) for part in text.split(","))
    except ValueError:
        values = ()
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(
            f"expected positive integers separated by commas (such as 1,2,8), got {text!r}"
        )
    if max(values) > LARGEST_AXIS:
        raise argparse.ArgumentTypeError(
            f"{max(values)} is larger than any tensor axis can be ({LARGEST_AXIS}), in {text!r}"
        )
    return values


def _positive_integer(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _folder(text: str) -> Path:
    if not text.strip():  # Path("") is the current folder: artifacts among the user's files
        raise argparse.ArgumentTypeError(
            "empty: give the folder for the artifacts (such as --out out)"
        )
    return Path(text)


def default_out() -> Path:
    """`export/artifacts` when run inside the repository checkout, else ./keras-posenc-artifacts."""
    in_checkout = (CHECKOUT / "export" / "__main__.py").is_file() and (
        CHECKOUT / "pyproject.toml"
    ).is_file()
    if in_checkout and Path.cwd().resolve().is_relative_to(CHECKOUT):
        return CHECKOUT_ARTIFACTS
    return Path(ARTIFACTS_NAME)


def _parser(prog: str) -> argparse.ArgumentParser:
    """The job's parser: what to export and where, how, and how it is verified."""
    parser = argparse.ArgumentParser(
        prog=prog,
        description=(
            "Export encoders to SavedModel, ONNX and LiteRT and verify the SavedModel, "
            "onnxruntime and LiteRT against Keras. Without --model: the built-in default "
            "encoders (" + ", ".join(ENCODERS) + ")."
        ),
    )
    source = parser.add_mutually_exclusive_group()
    source.add_argument(
        "--encoder",
        action="append",
        choices=ENCODERS,
        help="export this default encoder (repeat for several; default: all)",
    )
    source.add_argument(
        "--model", type=Path, metavar="PATH.keras", help="export this saved Keras model instead"
    )
    parser.add_argument(
        "--import",
        dest="imports",
        action="append",
        default=[],
        metavar="MODULE",
        help="import this Python module (from the current folder or the installed packages) "
        "before loading --model: the one that defines and registers the model's own layers "
        "(keras.saving.register_keras_serializable); repeat for several",
    )
    parser.add_argument(
        "--out",
        type=_folder,
        metavar="DIR",
        default=None,
        help="folder for the artifacts, one subfolder per model (default: export/artifacts "
        f"in the repository checkout, else ./{ARTIFACTS_NAME})",
    )
    _add_export_options(parser)
    _add_verification_options(parser)
    parser.add_argument(
        "--debug",
        action="store_true",
        help="show TensorFlow's and the converters' own log lines too",
    )
    return parser


def _add_export_options(parser: argparse.ArgumentParser) -> None:
    """How the files are written: the opset, the form of RoPE, the positions served."""
    parser.add_argument(
        "--opset",
        type=int,
        metavar="N",
        default=DEFAULT_OPSET,
        help=f"ONNX opset, one of {', '.join(map(str, SUPPORTED_OPSETS))} (23: ONNX's own "
        f"RotaryEmbedding op; default {DEFAULT_OPSET})",
    )
    parser.add_argument(
        "--rotary",
        choices=("fused", "decomposed"),
        default="fused",
        help="RoPE in the ONNX file: onnxruntime's fused kernel, or standard ops only "
        "(default: fused)",
    )
    parser.add_argument(
        "--max-sequence-length",
        "--max-length",
        dest="max_length",
        type=_positive_integer,
        metavar="N",
        help="the largest position + 1 the files serve (with a start_index input, start + "
        "length stay within it): their position tables hold only the rows below it, and "
        "verification goes up to it (default: the smallest learned position table, if any; "
        "else unbounded). --max-length is the old name",
    )


def _add_verification_options(parser: argparse.ArgumentParser) -> None:
    """What the verification runs: its shapes and how often each timed one is called."""
    for flag, default, what in (
        ("--batch-sizes", BATCH_SIZES, "batch sizes to verify"),
        (
            "--sequence-lengths",
            SEQUENCE_LENGTHS,
            "sequence lengths to verify, with the longest the model allows",
        ),
    ):
        parser.add_argument(
            flag,
            type=_positive_integers,
            default=default,
            metavar="N,N,...",
            help=f"{what} (default: {','.join(map(str, default))})",
        )
    parser.add_argument(
        "--repeats",
        type=_positive_integer,
        metavar="N",
        default=REPEATS,
        help="timed calls per runtime for the shapes the table shows; latency is their "
        f"median (default: {REPEATS})",
    )


def _glued(argv: Sequence[str]) -> list[str]:
    """`--batch-sizes -1,2` as `--batch-sizes=-1,2`: argparse takes `-1,2` for an option."""
    glued, pending = [], None
    for word in argv:
        if pending is not None:
            glued.append(f"{pending}={word}")
            pending = None
        elif word in ("--batch-sizes", "--sequence-lengths") and word == argv[-1]:
            glued.append(word)
        elif word in ("--batch-sizes", "--sequence-lengths"):
            pending = word
        else:
            glued.append(word)
    return glued


def user_module_path() -> None:
    """The current folder on `sys.path` (last), where `--import` finds the user's modules
    whether the CLI runs as `python -m` (which adds it) or as the console script."""
    import os
    import sys

    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.append(os.getcwd())


def _importable(module: str) -> bool:
    import importlib.util

    user_module_path()
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a missing parent package, an empty name
        return False


def parse_arguments(
    argv: Sequence[str] | None = None, prog: str = "keras-posenc-export"
) -> argparse.Namespace:
    """The job's arguments; a bad one exits with status 2 and a message naming it."""
    import sys

    parser = _parser(prog)
    arguments = parser.parse_args(_glued(list(sys.argv[1:] if argv is None else argv)))
    if arguments.out is None:
        arguments.out = default_out()
    if arguments.opset not in SUPPORTED_OPSETS:
        parser.error(
            f"--opset {arguments.opset} is not supported: use one of "
            f"{', '.join(map(str, SUPPORTED_OPSETS))}"
        )
    if arguments.max_length is not None and arguments.max_length > MAX_POSITIONS:
        parser.error(
            f"--max-sequence-length {arguments.max_length} is past {MAX_POSITIONS}, the "
            "positions the files can serve: give at most that, or leave it out (unbounded)"
        )
    if arguments.encoder is not None:
        arguments.encoder = list(dict.fromkeys(arguments.encoder))  # each once, in order
    for module in arguments.imports:
        if not _importable(module):
            parser.error(
                f"--import {module}: no such module in the current folder or the installed "
                "packages (give its dotted name, such as my_package.layers)"
            )
    if arguments.model is not None:
        if not arguments.model.is_file():
            parser.error(f"--model {arguments.model}: no such file")
        if arguments.model.suffix != ".keras":
            parser.error(f"--model {arguments.model}: expected a .keras file (model.save(...))")
    return arguments
