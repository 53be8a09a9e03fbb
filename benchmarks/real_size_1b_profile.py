"""`python -m benchmarks.real_size_1b_profile WORK`: where the 1B export's memory goes, by line.

`benchmarks.real_size`'s export step (keras_hub loads `WORK/hf`, written by its `--step
hf`; `save_decoder` exports it to `WORK/profile_out` and verifies it), with the resident
memory (`VmRSS`) sampled every 0.1 s above the memory at the call, over the weight bytes:
the largest sample under each line `save_decoder` says on stderr (the phase, the case
and runtime verified), then the call's peak (`VmHWM`). docs/real_size.md gives a run.
"""

from __future__ import annotations

import json
import sys
import threading
from pathlib import Path

from benchmarks import real_size


def _status(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(field)


def profile(work: Path) -> dict:
    import keras_posenc.export as export_module
    from keras_posenc.export.decoder import progress

    lines, said, real_save = {}, progress.Progress.say, export_module.save_decoder
    current, base, done = ["before"], [None], threading.Event()

    def say(self, text):
        current[0] = text.split(" (")[0].split(": layer")[0]  # one row per phase, case, runtime
        lines.setdefault(current[0], 0)
        return said(self, text)

    def save_decoder(*args, **kwargs):
        base[0] = _status("VmRSS")  # what real_size.export takes as the memory before
        try:
            return real_save(*args, **kwargs)
        finally:
            lines["save_decoder peak (VmHWM)"] = _status("VmHWM") - base[0]
            current[0] = "after save_decoder (og tokens, keras_hub greedy)"

    def sample():
        while not done.wait(0.1):
            if base[0] is not None:
                rss = _status("VmRSS") - base[0]
                lines[current[0]] = max(lines.get(current[0], 0), rss)

    progress.Progress.say, export_module.save_decoder = say, save_decoder
    threading.Thread(target=sample, daemon=True).start()
    try:
        result = real_size.export(work / "hf", work / "profile_out")
    finally:
        done.set()
        progress.Progress.say, export_module.save_decoder = said, real_save
    weights = result["weight_bytes"]
    for line, rss in lines.items():
        print(f"| {line} | {rss / weights:.2f} |")
    kept = {k: v for k, v in result.items() if not k.endswith("_tokens")}
    print(json.dumps(kept, indent=1))
    return {"lines": {k: v / weights for k, v in lines.items()}, "export": kept}


if __name__ == "__main__":
    profile(Path(sys.argv[1]))
