"""`python -m benchmarks`: time the layers against the floor and keras_hub, write the results.

Example:

    python -m benchmarks --write-docs     # the full run; also writes docs/benchmarks.md
    python -m benchmarks --rounds 3 --layers rotary --modes xla eager
"""

from __future__ import annotations

import os
import sys

# `--backend jax|torch` picks Keras's backend, which must be set before Keras loads.
if "--backend" in sys.argv[1:-1]:
    os.environ["KERAS_BACKEND"] = sys.argv[sys.argv.index("--backend") + 1]
os.environ.setdefault("KERAS_BACKEND", "tensorflow")  # before TensorFlow or Keras load
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import argparse  # noqa: E402
import datetime  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import shlex  # noqa: E402
import subprocess  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

from benchmarks.choices import LAYERS, MODES  # noqa: E402

# Loaded by `_load_modules` once the arguments are parsed: `--help` and argument errors are
# answered without Keras and TensorFlow (seconds and hundreds of MB).
keras = tf = candidates = report = timing = None

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
DOCS = ROOT / "docs" / "benchmarks.md"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    parser.add_argument("--rounds", type=int, default=20, help="timed rounds (default 20)")
    parser.add_argument("--layers", nargs="+", choices=LAYERS, default=LAYERS)
    parser.add_argument("--modes", nargs="+", choices=MODES, default=MODES)
    parser.add_argument("--min-sample-ms", type=float, default=5.0, help="repeat faster calls")
    parser.add_argument("--out", type=Path, default=RESULTS, help="folder for latest.json/.md")
    parser.add_argument(
        "--write-docs",
        "--docs",
        dest="docs",
        action="store_true",
        help=f"also write {DOCS.relative_to(ROOT)} (tracked: only when asked)",
    )
    parser.add_argument("--without-keras-hub", action="store_true")
    parser.add_argument("--note", default="", help="a sentence on the machine, for the docs")
    parser.add_argument("--check", action="store_true", help="exit 1 on a floor or precision miss")
    parser.add_argument(
        "--backend",
        choices=("tensorflow", "jax", "torch"),
        default="tensorflow",
        help="Keras backend; jax and torch run benchmarks/backends.py (printed, not written)",
    )
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be at least 1.")
    return args


def _git(*command: str) -> str:
    return subprocess.run(
        ["git", *command], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.strip()


def _meta(args: argparse.Namespace, command: str, load_before: str, seconds: float) -> dict:
    import keras_posenc

    cpu = platform.processor() or platform.machine()
    with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
        cpu = next((ln.split(":", 1)[1].strip() for ln in cpuinfo if "model name" in ln), cpu)
    commit = _git("rev-parse", "--short", "HEAD")
    if _git("status", "--porcelain", "--", "keras_posenc"):
        commit += " (keras_posenc modified)"
    if Path(keras_posenc.__file__).resolve().parent != ROOT / "keras_posenc":
        commit = f"not the repository's: {keras_posenc.__file__}"
    hub = "not used" if args.without_keras_hub else _keras_hub().__version__
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{cpu}, {os.cpu_count()} CPUs, {platform.system()}",
        "note": args.note,
        "versions": f"Python {platform.python_version()}, TensorFlow {tf.__version__}, "
        f"Keras {keras.__version__}, keras-hub {hub}, keras_posenc at {commit}",
        "command": command,
        "rounds": args.rounds,
        "load_average": f"{load_before} before, {_load()} after",
        "seconds": round(seconds),
    }


def _keras_hub():
    try:
        import keras_hub
    except ImportError as error:
        raise SystemExit(
            "The keras_hub baseline needs keras-hub, a benchmark-only dependency: "
            "pip install -e '.[benchmark]' (or run with --without-keras-hub)."
        ) from error
    return keras_hub


def _load() -> str:
    return " ".join(f"{load:.2f}" for load in os.getloadavg())


def _load_modules() -> None:
    global keras, tf, candidates, report, timing
    import keras

    from benchmarks import candidates, report, timing
    from keras_posenc.backend.lazy import tf  # --backend jax / torch: no TensorFlow


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    _load_modules()
    if args.backend != keras.backend.backend():
        raise SystemExit(
            f"Keras runs on {keras.backend.backend()!r}: pass --backend on the command line "
            "(it must be set before Keras loads)."
        )
    if args.backend != "tensorflow":
        from benchmarks import backends

        return backends.main(args)
    keras.config.set_dtype_policy("float32")
    tf.get_logger().setLevel("ERROR")  # one tf.function per candidate: retracing warnings
    command = shlex.join(["python", "-m", "benchmarks", *(sys.argv[1:] if argv is None else argv)])
    load_before, began = _load(), time.perf_counter()
    min_sample = args.min_sample_ms / 1e3

    selected = candidates.cases(args.layers, args.modes)
    print(f"building and warming up {len(selected)} cases ...", file=sys.stderr, flush=True)
    prepared, timed = [], []
    hub = None if args.without_keras_hub else _keras_hub().layers
    for entry in candidates.prepare(selected, min_sample, hub):
        group = {name: timing.Timed(call) for name, call in entry.calls.items()}
        for t in group.values():
            timing.warm_up(t, min_sample)
        prepared.append(entry)
        timed.append(group)
    print(f"ready after {time.perf_counter() - began:.0f} s", file=sys.stderr, flush=True)

    timing.run_rounds([list(group.values()) for group in timed], args.rounds)
    # Decoding passes a new start every step: a call with a new value, then that value
    # again; a compilation shows as the difference between the two.
    for entry, group in zip(prepared, timed, strict=True):
        if entry.case.tensor_start and entry.case.mode != "eager":
            new_start = tf.constant(entry.case.start + 1, tf.int32)
            for t in group.values():
                t.new_start = timing.one_call(t.call, new_start)
                t.new_start_again = timing.one_call(t.call, new_start)

    table = report.rows(prepared, timed)
    found = report.misses(table)
    meta = _meta(args, command, load_before, time.perf_counter() - began)
    text = report.document(meta, table, found)
    report.write_whole(args.out / "latest.json", json.dumps({"meta": meta, "rows": table}))
    report.write_whole(args.out / "latest.md", text)
    if args.docs:
        report.write_whole(DOCS, text)
    print(text)
    print(f"wrote {args.out}/latest.json, latest.md" + (f" and {DOCS}" if args.docs else ""))
    return 1 if args.check and (found["floor"] or found["precision"]) else 0


if __name__ == "__main__":
    sys.exit(main())
