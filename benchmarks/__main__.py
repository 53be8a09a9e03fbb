"""`python -m benchmarks`: time the layers against the floor and keras_hub, write the results.

Example:

    python -m benchmarks                      # the full run (about 3 minutes on 2 idle cores)
    python -m benchmarks --quick --layers rotary --modes xla
"""

from __future__ import annotations

import os

# Before TensorFlow or Keras load.
os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import argparse  # noqa: E402
import datetime  # noqa: E402
import platform  # noqa: E402
import shlex  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from benchmarks import candidates, report, timing  # noqa: E402

RESULTS = Path(__file__).parent / "results"
# Settings that change what TensorFlow does on CPU; recorded with the results.
ENVIRONMENT_KEYS = (
    "TF_CPU_ALLOCATOR_USE_BFC",
    "TF_ENABLE_ONEDNN_OPTS",
    "TF_NUM_INTEROP_THREADS",
    "TF_NUM_INTRAOP_THREADS",
    "OMP_NUM_THREADS",
    "TF_XLA_FLAGS",
)


def _names(text: str, allowed: tuple[str, ...], what: str) -> tuple[str, ...]:
    names = tuple(name.strip() for name in text.split(",") if name.strip())
    unknown = [name for name in names if name not in allowed]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"unknown {what} {unknown or text!r}; choose from {', '.join(allowed)} "
            "(comma-separated)."
        )
    return names


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description=(
            "Times SinusoidalPositionalEncoding, RotaryEmbedding and LearnedPositionalEmbedding "
            "against the memory floor and keras_hub's layers, eager, in tf.function and under "
            "XLA, interleaved in one process, and writes latest.json and latest.md."
        ),
    )
    parser.add_argument("--rounds", type=int, default=None, help="timed rounds (default 40)")
    parser.add_argument(
        "--quick", action="store_true", help="5 rounds, shorter samples: for trying things out"
    )
    parser.add_argument(
        "--layers",
        type=lambda text: _names(text, candidates.LAYERS, "layer"),
        default=candidates.LAYERS,
        help="comma-separated subset of " + ",".join(candidates.LAYERS),
    )
    parser.add_argument(
        "--modes",
        type=lambda text: _names(text, candidates.MODES, "mode"),
        default=candidates.MODES,
        help="comma-separated subset of " + ",".join(candidates.MODES),
    )
    parser.add_argument(
        "--min-sample-ms",
        type=float,
        default=None,
        help="repeat calls faster than this within one sample (default 5, --quick 2)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=RESULTS,
        help=f"folder for latest.json and latest.md (default {RESULTS})",
    )
    parser.add_argument(
        "--readme",
        type=Path,
        action="append",
        default=[],
        help="also put the table into this file, between the lines "
        f"{report.README_START} and {report.README_END} (repeatable)",
    )
    parser.add_argument(
        "--without-keras-hub", action="store_true", help="skip the keras_hub baseline"
    )
    args = parser.parse_args(argv)
    if args.rounds is None:
        args.rounds = 5 if args.quick else 40
    if args.rounds < 1:
        parser.error("--rounds must be at least 1.")
    if args.min_sample_ms is None:
        args.min_sample_ms = 2.0 if args.quick else 5.0
    return args


def _machine() -> dict:
    model = platform.processor() or platform.machine()
    try:
        lscpu = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        for line in lscpu.splitlines():
            if line.startswith("Model name:"):
                model = line.split(":", 1)[1].strip()
    except (OSError, subprocess.CalledProcessError):
        pass
    memory_gib = None
    try:
        with open("/proc/meminfo", encoding="utf-8") as meminfo:
            kib = int(meminfo.readline().split()[1])
            memory_gib = round(kib / 2**20, 1)
    except (OSError, ValueError, IndexError):
        pass
    cores = os.cpu_count()
    return {
        "description": f"{model}, {cores} CPUs, {memory_gib} GiB, {platform.system()}",
        "cpu": model,
        "cpus": cores,
        "memory_gib": memory_gib,
        "platform": platform.platform(),
    }


def _commit() -> str:
    """The repository's commit, and whether the keras_posenc measured is another copy."""
    import keras_posenc

    root = Path(__file__).resolve().parent.parent
    measured = Path(keras_posenc.__file__).resolve().parent
    if measured != root / "keras_posenc":
        return f"not the repository's: {measured}"
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "keras_posenc"],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return commit + (" (keras_posenc modified)" if dirty else "")


def _versions(with_keras_hub: bool) -> dict:
    hub_version = "not used"
    if with_keras_hub:
        import keras_hub

        hub_version = keras_hub.__version__
    return {
        "python": platform.python_version(),
        "tensorflow": tf.__version__,
        "keras": keras.__version__,
        "keras_hub": hub_version,
        "numpy": np.__version__,
        "keras_posenc_commit": _commit(),
    }


def _load_average() -> str:
    try:
        return " ".join(f"{load:.2f}" for load in os.getloadavg())
    except OSError:
        return "unknown"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    keras.config.set_dtype_policy("float32")
    tf.get_logger().setLevel("ERROR")  # one tf.function per candidate: retracing warnings
    command = shlex.join(["python", "-m", "benchmarks", *(sys.argv[1:] if argv is None else argv)])
    load_before = _load_average()
    began = time.perf_counter()

    selected = candidates.cases(args.layers, args.modes)
    print(f"building and warming up {len(selected)} cases ...", file=sys.stderr, flush=True)
    prepared, timed = [], []
    for entry in candidates.prepare(selected, with_keras_hub=not args.without_keras_hub):
        group = {name: timing.Timed(call) for name, call in entry.calls.items()}
        for t in group.values():
            timing.warm_up(t, args.min_sample_ms / 1e3)
        prepared.append(entry)
        timed.append(group)
    print(f"ready after {time.perf_counter() - began:.0f} s", file=sys.stderr, flush=True)

    timing.run_rounds([list(group.values()) for group in timed], args.rounds)
    # Decoding passes a new start every step: does a new value trace or compile again?
    # A call with a new value, then the same value again: a compilation shows as the
    # difference (a value past the cached rows costs more both times, not once).
    for entry, group in zip(prepared, timed, strict=True):
        if entry.case.start.as_tensor and entry.case.mode != "eager":
            new_start = tf.constant(entry.case.start.value + 1, tf.int32)
            for t in group.values():
                t.new_start = timing.one_call(t.call, new_start)
                t.new_start_again = timing.one_call(t.call, new_start)

    table = report.rows(prepared, timed)
    targets = report.evaluate_targets(table)
    meta = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": _machine(),
        "versions": _versions(not args.without_keras_hub),
        "command": command,
        "rounds": args.rounds,
        "min_sample_ms": args.min_sample_ms,
        "environment": {key: os.environ[key] for key in ENVIRONMENT_KEYS if key in os.environ},
        "load_average": {"before": load_before, "after": _load_average()},
        "seconds": round(time.perf_counter() - began, 1),
    }
    text = report.write_results(args.out, meta, table, targets)
    for readme in args.readme:
        report.update_readme(readme, text)
    print(report.console_table(table))
    print()
    print(text.split("Targets:", 1)[1].strip())
    print(f"\nwrote {args.out / 'latest.json'} and {args.out / 'latest.md'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
