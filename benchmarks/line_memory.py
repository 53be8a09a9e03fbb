"""Peak resident memory and seconds of each line `save_decoder` says, and of each phase.

`save_decoder` says on stderr what it is doing (`progress.Progress.say`): the phase, the
layer written, each verification case and runtime, the float64 judge. `LineMemory`
wraps `Progress.say` so that each line's peak resident memory (`VmHWM` of
`/proc/self/status`, reset by writing 5 to `/proc/self/clear_refs` at every line: the
kernel sets it to the memory resident then) and seconds are recorded until the next
line, and groups the lines into the phases of docs/real_size.md (`phase_of`):

| phase | the lines |
| --- | --- |
| describe | describing the model |
| write | writing the files, `write model.onnx: layer i of n` |
| verify: reference | `verifying case k of n (batch ..): keras_hub` (every case, first) |
| verify: <runtime> | `verifying case k of n: onnxruntime` (each runtime every case in turn) |
| verify: judge | the description made again for the float64 decode, and the decode |
| done | the rest of the call (replacing the folder, done) |

Example:

```python
lines = LineMemory()
with lines:
    save_decoder(causal_lm, folder, max_length=1024)
lines.phases(weight_bytes)  # [{"phase", "seconds", "peak_over_weights"}, ...]
```
"""

from __future__ import annotations

import os
import re
import threading
import time

_CASE = re.compile(r"verifying case \d+ of \d+(?P<reference> \(batch [^)]*\))?: (?P<name>.+)")


def status(field: str) -> int:
    """A field of `/proc/self/status` in bytes (`VmRSS`, `VmHWM`)."""
    with open("/proc/self/status") as lines:
        for line in lines:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(field)


def reset_peak() -> None:
    """`VmHWM` from here (the kernel sets it to the current `VmRSS`)."""
    with open("/proc/self/clear_refs", "w") as refs:
        refs.write("5")


def line_of(text: str) -> str:
    """A line's row: its text without the seconds' details and the layer count."""
    return text.split(": layer ")[0].split(" (")[0] + (
        ": " + text.rsplit(": ", 1)[1] if _CASE.match(text) and "(batch" in text else ""
    )


def phase_of(text: str) -> str:
    """The phase of a line (the module docstring's table)."""
    case = _CASE.match(text)
    if case is not None:
        return "verify: reference" if case["reference"] else f"verify: {case['name']}"
    if "float64" in text:
        return "verify: judge"
    if text.startswith("describing"):
        return "describe"
    if text.startswith("writ"):
        return "write"
    return "done"


class LineMemory:
    """Each line's and phase's peak memory above the memory at `__enter__`, and seconds.

    Args:
        limit_bytes: a sampler thread ends the process (exit status 3) where the
            resident memory passes this (None: no limit), so that a reproduction
            cannot take a shared machine's memory.
    """

    def __init__(self, limit_bytes: int | None = None):
        self.limit_bytes = limit_bytes
        self.rows = []  # [{"line", "phase", "seconds", "peak"}], in the order said
        self._done = threading.Event()

    def __enter__(self) -> LineMemory:
        from keras_posenc.export.decoder import progress

        self._said = progress.Progress.say
        reset_peak()
        self.before = status("VmRSS")
        self._start("before the first line", "describe")
        line_memory = self

        def say(progress_self, text):
            line_memory._end()
            line_memory._start(line_of(text), phase_of(text))
            return line_memory._said(progress_self, text)

        progress.Progress.say = say
        if self.limit_bytes is not None:
            threading.Thread(target=self._guard, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        from keras_posenc.export.decoder import progress

        self._end()
        self._done.set()
        progress.Progress.say = self._said

    def _start(self, line: str, phase: str) -> None:
        reset_peak()
        at = status("VmRSS") - self.before
        self.rows.append({"line": line, "phase": phase, "start": time.perf_counter(), "at": at})

    def _end(self) -> None:
        row = self.rows[-1]
        row["seconds"] = time.perf_counter() - row.pop("start")
        row["peak"] = status("VmHWM") - self.before

    def _guard(self) -> None:
        while not self._done.wait(0.05):
            if status("VmRSS") > self.limit_bytes:
                print(
                    f"line_memory: past {self.limit_bytes / 2**30:.1f} GiB (the process held "
                    f"{self.before / 2**30:.2f} GiB before the call) at {self.rows[-1]['line']!r}, "
                    "ending",
                    flush=True,
                )
                os._exit(3)

    def lines(self, weight_bytes: int) -> list[dict]:
        """`[{"line", "phase", "seconds", "at_over_weights", "peak_over_weights"}]` in the
        order said (`at`: the memory when the line was said), a line said again at once
        (a phase's layers) merged into one row."""
        merged = []
        for row in self.rows:
            key = {"line": row["line"], "phase": row["phase"]}
            if not merged or {k: merged[-1][k] for k in key} != key:
                merged.append({**key, "seconds": 0.0, "peak": 0, "at": row["at"]})
            merged[-1]["seconds"] += row["seconds"]
            merged[-1]["peak"] = max(merged[-1]["peak"], row["peak"])
        return [_over(row, weight_bytes) for row in merged]

    def phases(self, weight_bytes: int) -> list[dict]:
        """`[{"phase", "seconds", "peak_over_weights"}]`, in the order first said."""
        merged = {}
        for row in self.rows:
            found = merged.setdefault(row["phase"], {"phase": row["phase"], "seconds": 0.0})
            found["seconds"] += row["seconds"]
            found["peak"] = max(found.get("peak", 0), row["peak"])
        return [_over(row, weight_bytes) for row in merged.values()]


def _over(row: dict, weight_bytes: int) -> dict:
    row = dict(row)
    row["peak_bytes"] = row.pop("peak")
    row["peak_over_weights"] = row["peak_bytes"] / weight_bytes
    if "at" in row:
        row["at_bytes"] = row.pop("at")
        row["at_over_weights"] = row["at_bytes"] / weight_bytes
    return row
