"""`python -m benchmarks.real_size_profile`: where `save_decoder`'s memory goes, line by line.

The 248M-parameter keras_hub Llama of `python -m benchmarks.real_size --memory` exported
and verified once (`max_length=256`, `external_data=True` unless `--one-file`), its
resident memory (`VmRSS`) sampled every 0.1 s above the memory before the call, over the
weight bytes: the largest sample under each line `save_decoder` says on stderr (the
phase, the layer written, the case and runtime verified), then the call's peak (`VmHWM`,
reset through `/proc/self/clear_refs`). docs/real_size.md gives a run.
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time
from pathlib import Path


def _status(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(field)


def profile(external_data: bool | None) -> dict:
    import keras_hub
    import numpy as np

    from keras_posenc.export import save_decoder
    from keras_posenc.export.decoder import progress

    backbone = keras_hub.models.LlamaBackbone(
        vocabulary_size=32000,
        num_layers=12,
        num_query_heads=16,
        hidden_dim=1024,
        intermediate_dim=4096,
        num_key_value_heads=4,
        dtype="float32",
    )
    causal_lm = keras_hub.models.LlamaCausalLM(backbone=backbone, preprocessor=None)
    weights = sum(int(np.prod(w.shape)) for w in backbone.weights) * 4
    lines, said = {}, progress.Progress.say  # line -> largest RSS sample under it

    def say(self, text):
        current[0] = text.split(" (")[0].split(": layer")[0]  # one row per phase, case, runtime
        lines.setdefault(current[0], 0)
        return said(self, text)

    current, done = ["before"], threading.Event()
    progress.Progress.say = say
    with open("/proc/self/clear_refs", "w") as refs:
        refs.write("5")  # VmHWM from here
    before = _status("VmRSS")

    def sample():
        while not done.wait(0.1):
            lines[current[0]] = max(lines.get(current[0], 0), _status("VmRSS") - before)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as folder:
        save_decoder(causal_lm, Path(folder) / "out", max_length=256, external_data=external_data)
    seconds, peak = time.perf_counter() - start, _status("VmHWM") - before
    done.set()
    sampler.join()
    progress.Progress.say = said
    for line, rss in lines.items():
        print(f"| {line} | {rss / weights:.2f} |")
    print(f"| peak (VmHWM) | {peak / weights:.2f} |  ({seconds:.1f} s)")
    return {"lines": {k: v / weights for k, v in lines.items()}, "peak": peak / weights}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--one-file", action="store_true", help="external_data=None")
    args = parser.parse_args(argv)
    return profile(None if args.one_file else True)


if __name__ == "__main__":
    main()
