"""What comes out: medians and ratios per case, the rows to look at, JSON and Markdown."""

from __future__ import annotations

import math
import os
import statistics
import tempfile
from pathlib import Path

from benchmarks import candidates, timing
from benchmarks.candidates import PRECISION_BOUND, TINY_SHAPE, Prepared
from benchmarks.timing import Timed

# The floor bound `--check` holds ours to in tf.function and XLA, within the cached rows.
FLOOR_BOUND = 1.2


def sign_test(successes: int, trials: int) -> float:
    """Two-sided p-value of `successes` in `trials` rounds if either side were as likely
    to be faster in each round (the sign test on paired samples)."""
    tail = min(successes, trials - successes)
    return min(1.0, 2 * sum(math.comb(trials, k) for k in range(tail + 1)) / 2**trials)


def _ratio(numerator: Timed, denominator: Timed) -> dict:
    """The ratio of the medians, and the rounds in which the numerator was the faster (each
    round's two samples ran side by side)."""
    pairs = list(zip(numerator.samples, denominator.samples, strict=True))
    return {
        "of_medians": statistics.median(numerator.samples) / statistics.median(denominator.samples),
        "numerator_faster_rounds": sum(a < b for a, b in pairs),
        "rounds": len(pairs),
    }


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1e3


def rows(prepared: list[Prepared], timed: list[dict[str, Timed]]) -> list[dict]:
    """One JSON-ready row per case: per-candidate times (ms) and errors, and the ratios."""
    out = []
    for entry, group in zip(prepared, timed, strict=True):
        case = entry.case
        results = {
            name: {
                "median_ms": statistics.median(t.samples) * 1e3,
                "min_ms": min(t.samples) * 1e3,
                "repeats_per_sample": t.repeats,
                "max_abs_error": entry.max_abs_error[name],
                "new_start_first_call_ms": _ms(t.new_start),
                "new_start_second_call_ms": _ms(t.new_start_again),
                "samples_ms": [round(s * 1e3, 5) for s in t.samples],
            }
            for name, t in group.items()
        }
        pairs = [("ours", "floor"), ("control", "floor"), ("keras_hub", "ours")]
        out.append(
            {
                "layer": case.layer,
                "shape": list(case.shape),
                "start": case.start_label,
                "mode": case.mode,
                "past_cache": case.past_cache,
                "floor_form": entry.floor_form,
                "form_medians_ms": entry.form_medians
                and {name: s * 1e3 for name, s in entry.form_medians.items()},
                "results": results,
                "ratios": {f"{a}/{b}": _ratio(group[a], group[b]) for a, b in pairs if a in group},
            }
        )
    return out


def row_name(row: dict) -> str:
    return f"{row['layer']} {'x'.join(map(str, row['shape']))} {row['start']} {row['mode']}"


def _held_to_floor(row: dict) -> bool:
    return row["mode"] != "eager" and tuple(row["shape"]) != TINY_SHAPE and not row["past_cache"]


def misses(table: list[dict]) -> dict[str, list[str]]:
    """The rows to look at, each with its noise (control/floor) and its sign test.

    `floor`: ours/floor above `FLOOR_BOUND` where ours is held to the floor; `keras_hub`:
    keras_hub faster than ours; `precision`: ours off float64 by more than `PRECISION_BOUND`.
    """

    def detail(row: dict, ratio: str) -> str:
        r = row["ratios"][ratio]
        faster, rounds = r["numerator_faster_rounds"], r["rounds"]
        return (
            f"{row_name(row)}: {ratio} {r['of_medians']:.2f} (control/floor "
            f"{row['ratios']['control/floor']['of_medians']:.2f}; {ratio.split('/')[0]} faster "
            f"in {faster} of {rounds} rounds, sign test p = {sign_test(faster, rounds):.2g})"
        )

    found = {"floor": [], "keras_hub": [], "precision": []}
    for row in table:
        ratios = row["ratios"]
        if _held_to_floor(row) and ratios["ours/floor"]["of_medians"] > FLOOR_BOUND:
            found["floor"].append(detail(row, "ours/floor"))
        if "keras_hub/ours" in ratios and ratios["keras_hub/ours"]["of_medians"] < 1:
            found["keras_hub"].append(detail(row, "keras_hub/ours"))
        if (error := row["results"]["ours"]["max_abs_error"]) > PRECISION_BOUND:
            found["precision"].append(f"{row_name(row)}: {error:.2g}")
    return found


def results_table(table: list[dict]) -> list[str]:
    lines = [
        "| layer | shape | start | mode | floor | ours | keras_hub | ours/floor "
        "| keras_hub/ours | control/floor | ours err | keras_hub err |",
        "|---|---|---|---|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for row in table:
        results, ratios = row["results"], row["ratios"]
        times = [results.get(n) for n in ("floor", "ours", "keras_hub")]
        times = ["–" if r is None else f"{r['median_ms']:.3f} ({r['min_ms']:.3f})" for r in times]
        quotients = [ratios.get(k) for k in ("ours/floor", "keras_hub/ours", "control/floor")]
        quotients = ["–" if q is None else f"{q['of_medians']:.2f}" for q in quotients]
        errors = [results.get(n) for n in ("ours", "keras_hub")]
        errors = ["–" if r is None else f"{r['max_abs_error']:.1e}" for r in errors]
        start = row["start"] + (" †" if row["past_cache"] else "")
        cells = [row["layer"], str(tuple(row["shape"])), start, row["mode"], *times, *quotients]
        lines.append("| " + " | ".join(cells + errors) + " |")
    return lines


def forms_table(table: list[dict]) -> list[str]:
    """The rotary floor's trial: each swap form's median (ms) per shape and mode."""
    trials = {}
    for row in table:
        if row["form_medians_ms"]:
            trials.setdefault((tuple(row["shape"]), row["mode"]), row["form_medians_ms"])
    if not trials:
        return []
    names = sorted({name for medians in trials.values() for name in medians})
    lines = [f"| shape | mode | {' | '.join(names)} |", "|---|---|" + "--:|" * len(names)]
    for (shape, mode), medians in trials.items():
        best = min(medians.values())
        cells = [
            "–" if n not in medians else f"{medians[n]:.3f}" + (" ←" if medians[n] == best else "")
            for n in names
        ]
        lines.append(f"| {shape} | {mode} | {' | '.join(cells)} |")
    return lines


def new_start_lines(table: list[dict]) -> list[str]:
    """Which candidates compile again when a tensor start takes a new value (a first call
    over 3x the next with that value, plus 5 ms), with the floor's worst first/next as noise."""
    again, worst = [], {"ours": 0.0, "floor": 0.0}
    for row in table:
        for name, result in row["results"].items():
            first, second = result["new_start_first_call_ms"], result["new_start_second_call_ms"]
            if first is not None:
                worst[name] = max(worst.get(name, 0.0), first / second)
                if name in ("ours", "keras_hub") and first > 3 * second + 5:
                    again.append(f"{name} in {row_name(row)}: {first:.0f} ms, then {second:.1f}")
    if not worst["floor"]:
        return []
    return [
        "A new start value (decoding's next step) in tf.function and XLA: the first call with "
        f"it takes ours at most {worst['ours']:.1f}x the next call with that value (the floor, "
        f"which compiles nothing, {worst['floor']:.1f}x). Compiled again: "
        + ("; ".join(again) if again else "none")
        + "."
    ]


def write_whole(path: Path, text: str) -> None:
    """Writes `text` to `path` through a temporary file in the same folder: whole or not at all."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(
        "w", dir=path.parent, prefix=f".{path.name}.", suffix=".tmp", delete=False
    ) as temporary:
        temporary.write(text)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(temporary.name, 0o666 & ~umask)  # NamedTemporaryFile makes it 0600
    os.replace(temporary.name, path)


def document(meta: dict, table: list[dict], found: dict[str, list[str]]) -> str:
    """The whole of `docs/benchmarks.md`: how it was run, what is measured, the results."""
    lines = [
        "# Benchmarks: speed against the memory floor and keras_hub",
        "",
        f"Written by `{meta['command']}` ({meta['date']}, {meta['seconds']} s): "
        f"{meta['rounds']} interleaved rounds after warm-up, on {meta['machine']}. "
        f"{meta['note']} Load average {meta['load_average']}. {meta['versions']}.",
        "",
        "Times are per call in ms, median (min) over the rounds; ratios divide medians. Medians "
        "move between runs on a shared machine: only ratios measured in one run mean anything.",
        "",
        "## What is measured",
        "",
        candidates.__doc__.strip(),
        "",
        "## How it is timed",
        "",
        timing.__doc__.strip(),
        "",
        "## Results",
        "",
        *results_table(table),
        "",
        "## Rows to look at",
        "",
        "Each with the rounds each side won and a two-sided sign test: p far below 0.05 is a "
        "real difference, p near 1 is noise.",
        "",
    ]
    for key, label in (
        ("floor", f"ours/floor above {FLOOR_BOUND} in a row held to the floor"),
        ("keras_hub", "keras_hub faster than ours"),
        ("precision", f"ours off float64 by more than {PRECISION_BOUND:g}"),
    ):
        lines.append(f"- {label}: {len(found[key]) or 'none'}")
        lines += [f"  - {item}" for item in found[key]]
    lines += ["", *new_start_lines(table)]
    if forms := forms_table(table):
        lines += [
            "",
            "## The rotary floor's swap forms",
            "",
            "Median ms per form in the floor's trial (← the floor): `roll` (`tf.roll` by half "
            "the width), `concat` (of the two slices), `reverse` (of a `(2, half)` view), "
            "`gather` (by a constant permutation), `halves` (`split`, the rotation per half on "
            "half-width tables, `concat`).",
            "",
            *forms,
        ]
    return "\n".join(lines) + "\n"
