"""What comes out: the table of medians and ratios, the targets, JSON and Markdown."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import statistics
import tempfile
from collections.abc import Callable
from pathlib import Path

from benchmarks.candidates import Prepared
from benchmarks.timing import Timed

README_START = "<!-- benchmark-table:start -->"
README_END = "<!-- benchmark-table:end -->"
# float32 arithmetic on values of size about 1 (a sum, or two products and a sum) rounds
# by a few 1e-8; 1e-6 leaves room for that and catches any real loss of precision.
PRECISION_BOUND = 1e-6


def _ratios(numerator: Timed, denominator: Timed) -> dict:
    """`numerator / denominator`: of the medians (the headline), of the minima, and the
    median of the per-round ratios (each round's two samples were taken side by side),
    with the number of rounds in which the numerator was the faster of the two."""
    pairs = list(zip(numerator.samples, denominator.samples, strict=True))
    return {
        "of_medians": statistics.median(numerator.samples) / statistics.median(denominator.samples),
        "of_minima": min(numerator.samples) / min(denominator.samples),
        "paired_median": statistics.median(a / b for a, b in pairs),
        "numerator_faster_rounds": sum(a < b for a, b in pairs),
        "rounds": len(pairs),
    }


def sign_test(successes: int, trials: int) -> float:
    """Two-sided p-value of `successes` in `trials` rounds if either side were as likely
    to be faster in each round (the sign test on paired samples)."""
    tail = min(successes, trials - successes)
    p = sum(math.comb(trials, k) for k in range(tail + 1)) / 2**trials
    return min(1.0, 2 * p)


def rows(prepared: list[Prepared], timed: list[dict[str, Timed]]) -> list[dict]:
    """One JSON-ready row per case: per-candidate times (ms) and errors, and the ratios."""
    out = []
    for entry, candidates in zip(prepared, timed, strict=True):
        case = entry.case
        results = {}
        for name, t in candidates.items():
            samples_ms = [s * 1e3 for s in t.samples]
            results[name] = {
                "median_ms": statistics.median(samples_ms),
                "min_ms": min(samples_ms),
                "repeats_per_sample": t.repeats,
                "max_abs_error": entry.max_abs_error[name],
                "new_start_first_call_ms": None if t.new_start is None else t.new_start * 1e3,
                "new_start_second_call_ms": (
                    None if t.new_start_again is None else t.new_start_again * 1e3
                ),
                "samples_ms": [round(s, 5) for s in samples_ms],
            }
        ratios = {
            "ours/floor": _ratios(candidates["ours"], candidates["floor"]),
            "control/floor": _ratios(candidates["control"], candidates["floor"]),
        }
        if "keras_hub" in candidates:
            ratios["keras_hub/ours"] = _ratios(candidates["keras_hub"], candidates["ours"])
        row = {
            "layer": case.layer,
            "shape": list(case.shape),
            "start": case.start.label,
            "mode": case.mode,
            "past_cache": case.past_cache,
            "tiny": case.tiny,
            "results": results,
            "ratios": ratios,
            "ours_over_floor": ratios["ours/floor"]["of_medians"],
            "control_over_floor": ratios["control/floor"]["of_medians"],
        }
        if "keras_hub/ours" in ratios:
            row["keras_hub_over_ours"] = ratios["keras_hub/ours"]["of_medians"]
        out.append(row)
    return out


@dataclasses.dataclass(frozen=True)
class Target:
    """A number the issue asks for: which rows it covers and what each must reach."""

    name: str
    applies: Callable[[dict], bool]
    value: Callable[[dict], float | None]
    holds: Callable[[float], bool]
    ratio: str | None = None  # the ratio `value` reads, for its per-round record


def _is(layer=None, shape=None, modes=None, tensor_start=None) -> Callable[[dict], bool]:
    def applies(row: dict) -> bool:
        return (
            (layer is None or row["layer"] == layer)
            and (shape is None or tuple(row["shape"]) == shape)
            and (modes is None or row["mode"] in modes)
            and (tensor_start is None or row["start"].startswith("tensor") == tensor_start)
            and not row["past_cache"]
        )

    return applies


def _hub_ratio(row: dict) -> float | None:
    return row.get("keras_hub_over_ours")


TARGETS = (
    Target(
        "ours/floor <= 1.2 in tf.function and XLA, every layer and shape, int and tensor start",
        lambda row: _is(modes=("function", "xla"))(row) and not row["tiny"],
        lambda row: row["ours_over_floor"],
        lambda ratio: ratio <= 1.2,
        "ours/floor",
    ),
    Target(
        "sinusoidal (1, 4096, 1024), eager and tf.function: keras_hub/ours >= 4",
        _is("sinusoidal", (1, 4096, 1024), ("eager", "function")),
        _hub_ratio,
        lambda ratio: ratio >= 4.0,
    ),
    Target(
        "sinusoidal (1, 4096, 1024), XLA, start tensor: keras_hub/ours >= 3",
        _is("sinusoidal", (1, 4096, 1024), ("xla",), tensor_start=True),
        _hub_ratio,
        lambda ratio: ratio >= 3.0,
    ),
    Target(
        "rotary (1, 4096, 32, 128), XLA, start tensor: keras_hub/ours >= 2",
        _is("rotary", (1, 4096, 32, 128), ("xla",), tensor_start=True),
        _hub_ratio,
        lambda ratio: ratio >= 2.0,
    ),
    Target(
        "never slower than keras_hub: keras_hub/ours >= 1 in every row",
        lambda row: "keras_hub_over_ours" in row,
        _hub_ratio,
        lambda ratio: ratio >= 1.0,
        "keras_hub/ours",
    ),
    Target(
        "eager per-call cost on (1, 16, 64) <= 1 ms",
        lambda row: row["tiny"] and row["mode"] == "eager",
        lambda row: row["results"]["ours"]["median_ms"],
        lambda ms: ms <= 1.0,
    ),
    Target(
        f"precision: ours max |error| against float64 <= {PRECISION_BOUND:g} in every row",
        lambda row: True,
        lambda row: row["results"]["ours"]["max_abs_error"],
        lambda error: error <= PRECISION_BOUND,
    ),
)


def row_name(row: dict) -> str:
    shape = "x".join(map(str, row["shape"]))
    return f"{row['layer']} {shape} {row['start']} {row['mode']}"


def evaluate_targets(table: list[dict]) -> list[dict]:
    """Each target with the value of every row it covers and whether all of them hold."""
    evaluated = []
    for target in TARGETS:
        checks = [
            {
                "row": row_name(row),
                "value": value,
                "holds": target.holds(value),
                "control_over_floor": row["control_over_floor"],
                "paired": row["ratios"][target.ratio] if target.ratio else None,
            }
            for row in table
            if target.applies(row) and (value := target.value(row)) is not None
        ]
        evaluated.append(
            {
                "target": target.name,
                "met": bool(checks) and all(c["holds"] for c in checks),
                "measured": bool(checks),
                "misses": [c for c in checks if not c["holds"]],
                "checks": checks,
            }
        )
    return evaluated


def _ms(result: dict | None) -> str:
    if result is None:
        return "–"
    return f"{result['median_ms']:.3f} ({result['min_ms']:.3f})"


def _ratio(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}"


def markdown(meta: dict, table: list[dict], targets: list[dict]) -> str:
    lines = [
        f"Measured {meta['date']} on {meta['machine']['description']}; "
        f"Python {meta['versions']['python']}, TensorFlow {meta['versions']['tensorflow']}, "
        f"Keras {meta['versions']['keras']}, keras-hub {meta['versions']['keras_hub']}, "
        f"keras_posenc at {meta['versions']['keras_posenc_commit']}.",
        "",
        f"Command: `{meta['command']}` ({meta['rounds']} interleaved rounds after warm-up, "
        f"float32; load average {meta['load_average']['before']} before, "
        f"{meta['load_average']['after']} after).",
        "",
        "Times are per call in ms, median (min) over the rounds. `floor` is `x + c` "
        "(rotary: `x·C + swap(x)·S`) with constant rows; ratio columns divide medians. "
        "`control` is the floor timed again as its own candidate: `control/floor` shows "
        "how far identical work drifts in that row (the noise of this machine). Rows "
        "marked † start past the 4096 cached rows (our layers compute the rows exactly): "
        "reported, not held to the floor target. `err`: max |output − float64 reference|.",
        "",
        "| layer | shape | start | mode | floor | ours | keras_hub | ours/floor "
        "| keras_hub/ours | control/floor | ours err | keras_hub err |",
        "|---|---|---|---|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for row in table:
        results = row["results"]
        hub = results.get("keras_hub")
        start = row["start"] + (" †" if row["past_cache"] else "")
        lines.append(
            f"| {row['layer']} | {tuple(row['shape'])} | {start} | {row['mode']} "
            f"| {_ms(results['floor'])} | {_ms(results['ours'])} | {_ms(hub)} "
            f"| {_ratio(row['ours_over_floor'])} | {_ratio(row.get('keras_hub_over_ours'))} "
            f"| {_ratio(row['control_over_floor'])} "
            f"| {results['ours']['max_abs_error']:.1e} "
            f"| {'–' if hub is None else format(hub['max_abs_error'], '.1e')} |"
        )
    lines += ["", "Targets:", ""]
    for target in targets:
        if not target["measured"]:
            verdict = "not measured"
        elif target["met"]:
            verdict = "**met**"
        else:
            misses = "; ".join(
                f"{m['row']}: {m['value']:.3g} ({_miss_detail(m)})" for m in target["misses"]
            )
            verdict = f"**missed** ({misses})"
        lines.append(f"- {target['target']}: {verdict}")
    lines += ["", *_new_start_lines(table)]
    return "\n".join(lines) + "\n"


def _miss_detail(miss: dict) -> str:
    """The row's noise: control/floor, and for a ratio, how its rounds split."""
    detail = f"control/floor {miss['control_over_floor']:.2f}"
    paired = miss["paired"]
    if paired is None:
        return detail
    faster, rounds = paired["numerator_faster_rounds"], paired["rounds"]
    p = sign_test(faster, rounds)
    return f"{detail}; numerator faster in {faster} of {rounds} rounds, sign test p = {p:.2g}"


def _new_start_lines(table: list[dict]) -> list[str]:
    """Which candidates trace or compile again when a tensor start takes a new value."""
    compiled, worst_ours, measured = [], 0.0, False
    for row in table:
        for name, result in row["results"].items():
            first, again = result["new_start_first_call_ms"], result["new_start_second_call_ms"]
            if first is None:
                continue
            measured = True
            if name == "ours":
                worst_ours = max(worst_ours, first / again)
            if first > 3 * again + 5:
                compiled.append(f"{name} in {row_name(row)}: {first:.0f} ms, then {again:.1f} ms")
    if not measured:
        return []
    lines = [
        "A new start value (decoding's next step) in tf.function and XLA: the first call "
        f"with it takes ours at most {worst_ours:.1f}x the next call with the same value."
    ]
    if compiled:
        lines.append(
            "Compiled again for a new value (first call > 3x the next + 5 ms): "
            + "; ".join(compiled)
            + "."
        )
    return lines


def console_table(table: list[dict]) -> str:
    header = (
        f"{'case':44} {'floor ms':>9} {'ours ms':>9} {'hub ms':>9} "
        f"{'ours/floor':>10} {'hub/ours':>9} {'ctrl/floor':>10}"
    )
    lines = [header, "-" * len(header)]
    for row in table:
        results = row["results"]
        hub = results.get("keras_hub")
        name = row_name(row) + (" †" if row["past_cache"] else "")
        lines.append(
            f"{name:44} {results['floor']['median_ms']:9.3f} {results['ours']['median_ms']:9.3f} "
            f"{hub['median_ms'] if hub else float('nan'):9.3f} "
            f"{row['ours_over_floor']:10.2f} {row.get('keras_hub_over_ours', float('nan')):9.2f} "
            f"{row['control_over_floor']:10.2f}"
        )
    return "\n".join(lines)


def write_whole(path: Path, text: str) -> None:
    """Writes `text` to `path` through a temporary file in the same folder: whole or not at all."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(
        "w", dir=path.parent, prefix=f".{path.name}.", delete=False, encoding="utf-8"
    ) as temporary:
        temporary.write(text)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(temporary.name, 0o666 & ~umask)  # mkstemp makes it 0600
    os.replace(temporary.name, path)


def write_results(out_dir: Path, meta: dict, table: list[dict], targets: list[dict]) -> str:
    """Writes `latest.json` and `latest.md` under `out_dir`; returns the Markdown."""
    text = markdown(meta, table, targets)
    document = {"meta": meta, "rows": table, "targets": targets}
    write_whole(out_dir / "latest.json", json.dumps(document, indent=1) + "\n")
    write_whole(out_dir / "latest.md", text)
    return text


def update_readme(path: Path, text: str) -> None:
    """Replaces the block between the benchmark-table markers of `path` with `text`."""
    readme = path.read_text(encoding="utf-8")
    if README_START not in readme or README_END not in readme:
        raise SystemExit(
            f"{path} has no benchmark table block; add the lines {README_START!r} and "
            f"{README_END!r} where the table should go."
        )
    head, rest = readme.split(README_START, 1)
    _, tail = rest.split(README_END, 1)
    write_whole(path, f"{head}{README_START}\n{text}{README_END}{tail}")
