"""`python -m benchmarks.precision`: max error against float64, ours and keras_hub's layers.

Each layer encodes (or rotates) every position from 0 up to a large one, in chunks, and is
compared with the formulas of `tests/reference.py`; the table is printed, and written to
`docs/precision.md` (tracked) only with `--write-docs`, or to `--out PATH`.
"""

from __future__ import annotations

import os

os.environ.setdefault("KERAS_BACKEND", "tensorflow")  # before TensorFlow or Keras load
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import argparse  # noqa: E402
import datetime  # noqa: E402
import shlex  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import keras_posenc  # noqa: E402
from benchmarks import reference  # noqa: E402
from benchmarks.report import write_whole  # noqa: E402

WIDTH, HEAD_DIM, CHUNK = 64, 16, 2**16
DOCS = Path(__file__).resolve().parent.parent / "docs" / "precision.md"


def max_errors(encode, expected, last: int) -> np.ndarray:
    """Max abs error at each position below `last`: `encode(start, n)` against `expected(p)`."""
    errors = []
    for start in range(0, last, CHUNK):
        positions = np.arange(start, min(start + CHUNK, last))
        error = np.abs(np.asarray(encode(start, len(positions)), np.float64) - expected(positions))
        errors.append(error.reshape(len(positions), -1).max(axis=1))
    return np.concatenate(errors)


def sinusoidal(layer, last: int) -> np.ndarray:
    # keras_hub's layer returns the encoding alone; with zero inputs ours does too.
    zeros = np.zeros((1, CHUNK, WIDTH), np.float32)
    return max_errors(
        lambda s, n: tf.cast(layer(zeros[:, :n], start_index=s)[0], tf.float32),
        lambda p: reference.sinusoidal(p, WIDTH),
        last,
    )


def rotary(layer, last: int) -> np.ndarray:
    x = np.random.default_rng(0).uniform(-1, 1, (1, CHUNK, 1, HEAD_DIM)).astype(np.float32)
    return max_errors(
        lambda s, n: layer(x[:, :n], start_index=s)[0],
        lambda p: reference.rotary(x[:, : len(p)], p)[0],
        last,
    )


def table(hub) -> list[str]:
    """The Markdown rows: each quantity's max error, ours and keras_hub's (`hub` or None)."""
    ours, theirs = keras_posenc, hub
    quantities = (
        ("sinusoidal encoding, float32", f"0 .. 2^20 (width {WIDTH})", sinusoidal, 2**20,
         "SinusoidalPositionalEncoding", "SinePositionEncoding", {}),
        ("RoPE output, inputs in [-1, 1], float32", f"0 .. 2^20 (head_dim {HEAD_DIM})", rotary,
         2**20, "RotaryEmbedding", "RotaryEmbedding", {}),
        ("sinusoidal encoding, mixed_bfloat16", f"0 .. 1e5 (width {WIDTH})", sinusoidal, 10**5,
         "SinusoidalPositionalEncoding", "SinePositionEncoding", {"dtype": "mixed_bfloat16"}),
    )  # fmt: skip
    lines = [
        "| quantity | positions | keras-posenc max error | keras_hub max error "
        "| keras_hub below 1e4 / 1e5 |",
        "|---|---|--:|--:|--:|",
    ]
    for label, span, run, last, our_name, their_name, kwargs in quantities:
        mine = run(getattr(ours, our_name)(**kwargs), last).max()
        if theirs is None:
            lines.append(f"| {label} | {span} | {mine:.2g} | – | – |")
            continue
        errors = run(getattr(theirs, their_name)(**kwargs), last)
        below = " / ".join(f"{errors[:n].max():.2g}" for n in (10**4, 10**5))
        lines.append(f"| {label} | {span} | {mine:.2g} | {errors.max():.2g} | {below} |")
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.precision", description=__doc__)
    parser.add_argument("--out", type=Path, default=None, help="also write the page here")
    parser.add_argument(
        "--write-docs", action="store_true", help=f"also write {DOCS} (tracked: only when asked)"
    )
    parser.add_argument("--without-keras-hub", action="store_true")
    args = parser.parse_args(argv)
    argv = sys.argv[1:] if argv is None else argv
    command = shlex.join(["python", "-m", "benchmarks.precision", *argv])
    hub, versions = None, f"TensorFlow {tf.__version__}, Keras {keras.__version__}"
    if not args.without_keras_hub:
        import keras_hub

        hub, versions = keras_hub.layers, f"{versions}, keras-hub {keras_hub.__version__}"
    rows = table(hub)
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    text = "\n".join(
        [
            "# Precision against float64",
            "",
            f"Written by `{command}` ({date}, {versions}, CPU): the max "
            "abs error of each layer's output against the formula in numpy float64 "
            "(`tests/reference.py`), over every position in the range.",
            "",
            *rows,
        ]
    )
    print(text)
    targets = ([args.out] if args.out is not None else []) + ([DOCS] if args.write_docs else [])
    for path in targets:
        write_whole(path, text + "\n")
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
