"""`python -m benchmarks.real_size_profile`: where `save_decoder`'s memory goes, line by line.

A keras_hub Llama with random weights exported and verified once (`external_data=True`
unless `--one-file`), with each line `save_decoder` says on stderr (the phase, the layer
written, the case and runtime verified, the float64 judge) and its peak resident memory
above the memory before the call (`VmHWM`, reset at every line: `line_memory.py`), over
the weight bytes, then each phase's. docs/real_size.md gives runs.

    python -m benchmarks.real_size_profile              # the 248M model, max_length 256
    python -m benchmarks.real_size_profile --logits     # logits-dominated, the judge forced

`--logits` reproduces the 1B run's teacher-forced case at a size that fits beside other
jobs: vocabulary 128256 (Llama 3's), hidden 256, 2 layers, the head tied, so one prompt
of `--max-length` tokens' logits (float32 and float64) outweigh the weights; and
`--drift` moves the reference's logits by a constant per row growing with the position
past the greedy cases' (71), to `--drift` tolerances at the last one (the argmax
unchanged: keras_hub's float32 RoPE angles did this at 1B, 1.19 tolerances at position
1023), so the runtimes fail the teacher-forced case against it and the float64 decode
judges them, as in the 1B run.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from benchmarks.line_memory import LineMemory, status
from keras_posenc.export.decoder.check import PROMPT, STEPS

LOGITS_MODEL = dict(
    vocabulary_size=128256,
    num_layers=2,
    num_query_heads=4,
    hidden_dim=256,
    intermediate_dim=768,
    num_key_value_heads=2,
    tie_word_embeddings=True,
)
GREEDY_END = PROMPT + STEPS - 1  # the greedy cases' last position (71)
MODEL_248M = dict(
    vocabulary_size=32000,
    num_layers=12,
    num_query_heads=16,
    hidden_dim=1024,
    intermediate_dim=4096,
    num_key_value_heads=4,
)


def drifting(greedy, tolerances: float, last_position: int):
    """`greedy` with each logit row moved by a share of its own tolerance
    (`logit_tolerance.bound`): 0 up to the greedy cases' last position, then growing to
    `tolerances` at `last_position` (only the teacher-forced case fails, as at 1B)."""
    import numpy as np

    from keras_posenc.export.decoder.logit_tolerance import bound, positions

    def moved(prompts, mask, steps):
        tokens, logits = greedy(prompts, mask, steps)
        at = positions(mask, steps)
        share = [
            tolerances * np.maximum(p - GREEDY_END, 0) / (last_position - GREEDY_END) for p in at
        ]
        first = [logits[0] + (bound(logits[0]) * share[0][..., None]).astype(logits[0].dtype)]
        rest = [
            x + (bound(x) * s[:, None]).astype(x.dtype)
            for x, s in zip(logits[1:], share[1:], strict=True)
        ]
        return tokens, first + rest

    return moved


def _force_judge(tolerances: float, last_position: int) -> None:
    from keras_posenc import keras_hub as bridge

    real = bridge.keras_hub_greedy
    bridge.keras_hub_greedy = lambda lm: drifting(real(lm), tolerances, last_position)


def profile(args) -> dict:
    import keras_hub
    import numpy as np

    from keras_posenc.export import save_decoder

    if args.logits:
        backbone = keras_hub.models.Llama3Backbone(**LOGITS_MODEL, dtype="float32")
        causal_lm = keras_hub.models.Llama3CausalLM(backbone=backbone, preprocessor=None)
    else:
        backbone = keras_hub.models.LlamaBackbone(**MODEL_248M, dtype="float32")
        causal_lm = keras_hub.models.LlamaCausalLM(backbone=backbone, preprocessor=None)
    weights = sum(int(np.prod(w.shape)) for w in backbone.weights) * 4
    if args.drift:
        _force_judge(args.drift, args.max_length - 1)
    limit = None if args.limit_gib is None else int(args.limit_gib * 2**30)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as folder, LineMemory(limit) as lines:
        report = save_decoder(
            causal_lm,
            Path(folder) / "out",
            max_length=args.max_length,
            external_data=None if args.one_file else True,
        )
    seconds = time.perf_counter() - start
    print(f"\nweights {weights:,} bytes; process before the call {lines.before / 2**30:.2f} GiB")
    print("| what save_decoder says | seconds | GiB when said | peak GiB | peak / weights |")
    print("| --- | --- | --- | --- | --- |")
    for row in lines.lines(weights):
        print(
            f"| {row['line']} | {row['seconds']:.1f} | {row['at_bytes'] / 2**30:.2f} | "
            f"{row['peak_bytes'] / 2**30:.2f} | {row['peak_over_weights']:.2f} |"
        )
    print("\n| phase | seconds | peak GiB | peak / weights |\n| --- | --- | --- | --- |")
    for row in lines.phases(weights):
        print(
            f"| {row['phase']} | {row['seconds']:.1f} | {row['peak_bytes'] / 2**30:.2f} | "
            f"{row['peak_over_weights']:.2f} |"
        )
    peak = max(row["peak"] for row in lines.rows)
    print(f"| save_decoder (all) | {seconds:.1f} | {peak / 2**30:.2f} | {peak / weights:.2f} |")
    judged = [
        {"case": case["name"], "runtime": name, "float64": result["float64"]}
        for case in report["cases"]
        for name, result in case["runtimes"].items()
        if "float64" in result
    ]
    print("judged by the float64 decode:", json.dumps(judged))
    print(f"process peak {status('VmHWM') / 2**30:.2f} GiB (since the last line)")
    return {"weight_bytes": weights, "lines": lines.lines(weights), "seconds": seconds}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--one-file", action="store_true", help="external_data=None")
    parser.add_argument("--logits", action="store_true", help="the logits-dominated model")
    parser.add_argument("--max-length", type=int, default=None)
    parser.add_argument("--drift", type=float, default=None, help="tolerances at the end")
    parser.add_argument("--limit-gib", type=float, default=None, help="end the process past it")
    args = parser.parse_args(argv)
    if args.max_length is None:
        args.max_length = 512 if args.logits else 256
    if args.drift is None:
        args.drift = 3.0 if args.logits else 0.0
    return profile(args)


if __name__ == "__main__":
    main()
