"""Precision of our layers and keras_hub's against the formulas in numpy float64.

Run from the repository root (needs `pip install -e ".[benchmark]"` for keras_hub):

    python -m benchmarks.precision [--out benchmarks/results]

For each quantity it prints the max abs error over a range of positions and at a few
checkpoints, for our layer and for keras_hub's, and writes `precision.json` / `.md`.
"""

from __future__ import annotations

import argparse
import datetime
import json
import pathlib
import platform

import keras
import numpy as np
import tensorflow as tf

import keras_posenc as kp

WIDTH = 64
LAST_POSITION = 2**20
CHUNK = 2**16


def sinusoid_reference(positions: np.ndarray, width: int) -> np.ndarray:
    """float64 `[sin(iω_0), cos(iω_0), ...]` (interleaved, the seeds' layout)."""
    omega = 10000.0 ** (-np.arange(0, width, 2) / width)
    angles = positions[:, None].astype(np.float64) * omega
    table = np.empty((len(positions), width))
    table[:, 0::2], table[:, 1::2] = np.sin(angles), np.cos(angles)
    return table


def rope_reference(x: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """float64 RoPE, half layout, for `x` of shape (1, n, 1, D)."""
    half = x.shape[-1] // 2
    omega = 10000.0 ** (-np.arange(0, 2 * half, 2) / (2 * half))
    angles = positions[:, None].astype(np.float64) * omega
    cos, sin = np.cos(angles)[None, :, None], np.sin(angles)[None, :, None]
    first, second = x[..., :half].astype(np.float64), x[..., half:].astype(np.float64)
    return np.concatenate([first * cos - second * sin, second * cos + first * sin], -1)


def keras_hub_layers():
    try:
        import keras_hub
    except ImportError:
        return None
    return keras_hub.layers


def per_position_errors(encode, reference, last: int) -> np.ndarray:
    """Max abs error at each position below `last` of `encode(start, n)`, run in chunks."""
    errors = []
    for start in range(0, last, CHUNK):
        positions = np.arange(start, min(start + CHUNK, last))
        error = np.abs(encode(start, len(positions)) - reference(positions))
        errors.append(error.reshape(1, len(positions), -1).max(axis=(0, 2)))
    return np.concatenate(errors)


def summarize(errors: np.ndarray) -> dict:
    """The max error overall and over the positions below a few checkpoints."""
    below = {
        str(n): float(errors[:n].max())
        for n in (1_000, 10_000, 100_000, 1_000_000)
        if n <= len(errors)
    }
    return {"max": float(errors.max()), "max_below": below}


def sinusoidal_errors(hub) -> dict:
    zeros = np.zeros((1, CHUNK, WIDTH), np.float32)
    ours = kp.SinusoidalPositionalEncoding()
    results = {
        "ours": summarize(
            per_position_errors(
                lambda s, n: ours(zeros[:, :n], start_index=s).numpy()[0],
                lambda p: sinusoid_reference(p, WIDTH),
                LAST_POSITION,
            )
        )
    }
    if hub is not None:
        theirs = hub.SinePositionEncoding()

        # keras_hub uses the concatenated layout: compare in its layout.
        def concat_reference(p):
            table = sinusoid_reference(p, WIDTH)
            return np.concatenate([table[:, 0::2], table[:, 1::2]], -1)

        results["keras_hub"] = summarize(
            per_position_errors(
                lambda s, n: theirs(zeros[:, :n], start_index=s).numpy()[0],
                lambda p: sinusoid_reference(p, WIDTH),
                LAST_POSITION,
            )
        )
    return results


def rotary_errors(hub) -> dict:
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, (1, CHUNK, 1, 16)).astype(np.float32)
    ours = kp.RotaryEmbedding()
    results = {
        "ours": summarize(
            per_position_errors(
                lambda s, n: ours(x[:, :n], start_index=s).numpy(),
                lambda p: rope_reference(x[:, : len(p)], p),
                LAST_POSITION,
            )
        )
    }
    if hub is not None:
        theirs = hub.RotaryEmbedding()
        results["keras_hub"] = summarize(
            per_position_errors(
                lambda s, n: theirs(x[:, :n], start_index=s).numpy(),
                lambda p: rope_reference(x[:, : len(p)], p),
                LAST_POSITION,
            )
        )
    return results


def bfloat16_errors(hub) -> dict:
    last = 100_000
    zeros = tf.zeros((1, CHUNK, WIDTH), tf.bfloat16)
    ours = kp.SinusoidalPositionalEncoding(dtype="mixed_bfloat16")

    def run(layer, reference):
        return summarize(
            per_position_errors(
                lambda s, n: tf.cast(layer(zeros[:, :n], start_index=s), tf.float32).numpy()[0],
                reference,
                last,
            )
        )

    results = {"ours": run(ours, lambda p: sinusoid_reference(p, WIDTH))}
    if hub is not None:
        theirs = hub.SinePositionEncoding(dtype="mixed_bfloat16")
        # keras_hub returns the encoding alone: with zero inputs that is x + P too.
        results["keras_hub"] = run(theirs, lambda p: sinusoid_reference(p, WIDTH))
    return results


def write_whole(path: pathlib.Path, text: str) -> None:
    """Write `text` to a temporary file beside `path`, then rename: whole or not at all."""
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(text)
    temporary.replace(path)


def markdown(report: dict) -> str:
    rows = [
        "| quantity | positions | keras-posenc max error | keras_hub max error |"
        " keras_hub below 1e4 / 1e5 |",
        "|---|---|---|---|---|",
    ]
    labels = {
        "sinusoidal": ("sinusoidal encoding, float32", f"0 .. 2^20 (width {WIDTH})"),
        "rotary": ("RoPE output, inputs in [-1, 1], float32", "0 .. 2^20 (head_dim 16)"),
        "bfloat16": ("sinusoidal encoding, mixed_bfloat16", f"0 .. 1e5 (width {WIDTH})"),
    }
    for key, (label, span) in labels.items():
        ours = report[key]["ours"]["max"]
        theirs = report[key].get("keras_hub")
        if theirs is None:
            rows.append(f"| {label} | {span} | {ours:.2g} | n/a | n/a |")
            continue
        below = theirs["max_below"]
        rows.append(
            f"| {label} | {span} | {ours:.2g} | {theirs['max']:.2g} | "
            f"{below['10000']:.2g} / {below['100000']:.2g} |"
        )
    return "\n".join(rows) + "\n"


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="benchmarks/results", help="folder for the results")
    args = parser.parse_args(argv)
    hub = keras_hub_layers()
    report = {
        "date": datetime.date.today().isoformat(),
        "machine": f"{platform.machine()}, {platform.processor() or 'cpu'}",
        "versions": {"tensorflow": tf.__version__, "keras": keras.__version__},
        "sinusoidal": sinusoidal_errors(hub),
        "rotary": rotary_errors(hub),
        "bfloat16": bfloat16_errors(hub),
    }
    if hub is not None:
        import keras_hub

        report["versions"]["keras_hub"] = keras_hub.__version__
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    table = markdown(report)
    write_whole(out / "precision.json", json.dumps(report, indent=2) + "\n")
    write_whole(
        out / "precision.md",
        f"Precision, {report['date']}, `python -m benchmarks.precision`\n\n{table}",
    )
    print(table)
    return report


if __name__ == "__main__":
    main()
