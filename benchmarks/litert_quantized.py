"""LiteRT decode step of `save_decoder`'s quantized files (int8 per channel, int4 block 32)
against the float32 file, in one process, interleaved.

The sizes of `decode_floor.py` (width 256, 4 layers; width 512, 8 layers; 8 query / 2
key-value heads, vocabulary 1024, cache 1024), batch 1 and 4, one token per row at
positions ~100 and ~900; each file's `decode` signature in `ai_edge_litert`'s interpreter
(XNNPACK, `num_threads=1`, `Invoke` only: the inputs, caches included, are set once), the
three files in a random order per round. Printed: each file's bytes and median ms, and the
medians of the per-round ratios to float32.

Run: `python -m benchmarks.litert_quantized [rounds]`.
"""

from __future__ import annotations

import random
import statistics
import sys

from benchmarks.decode_floor import MAX_LENGTH, SIZES, step_model
from benchmarks.decode_litert import litert_decode_call


def _files(size: dict) -> dict:
    """`{kind: tflite bytes}` of one random step model: float32, int8, int4."""
    import keras

    from keras_posenc.export.decoder import describe_decoder
    from keras_posenc.export.decoder.litert_decoder import decoder_litert
    from keras_posenc.export.decoder.quantization_arguments import litert_quantization

    keras.utils.set_random_seed(0)
    decoder = describe_decoder(step_model(size), MAX_LENGTH)
    return {
        "float32": decoder_litert(decoder),
        "int8": decoder_litert(decoder, litert_quantization(8, None)),
        "int4": decoder_litert(decoder, litert_quantization(4, 32)),
    }


def run(rounds: int = 40, sizes=tuple(SIZES)) -> list[dict]:
    rows = []
    for name in sizes:
        files = _files(SIZES[name])
        for batch in (1, 4):
            for position in (100, 900):
                calls = {
                    kind: litert_decode_call(data, batch, position) for kind, data in files.items()
                }
                for call in calls.values():
                    call(), call()  # warm up (XNNPACK packs the weights on the first)
                times = {kind: [] for kind in calls}
                order = random.Random(position * 10 + batch)
                for _ in range(rounds):
                    for kind in order.sample(list(calls), len(calls)):
                        times[kind].append(calls[kind]())
                ms = {kind: 1000 * statistics.median(t) for kind, t in times.items()}
                ratio = {
                    kind: statistics.median(
                        a / b for a, b in zip(times[kind], times["float32"], strict=True)
                    )
                    for kind in ("int8", "int4")
                }
                row = {"size": name, "batch": batch, "position": position, **ms}
                rows.append({**row, "ratio": ratio})
                print(
                    f"| {name} | {batch} | {position} | {ms['float32']:.3f} | {ms['int8']:.3f} "
                    f"| {ms['int4']:.3f} | {ratio['int8']:.2f} | {ratio['int4']:.2f} |",
                    flush=True,
                )
        print(
            f"bytes {name}: " + ", ".join(f"{kind} {len(data):,}" for kind, data in files.items()),
            flush=True,
        )
    return rows


def main(rounds: int = 40) -> list[dict]:
    with open("/proc/loadavg") as stream:
        print(f"load average: {stream.read().split()[:3]}")
    print(
        "| size | batch | position | float32 (ms) | int8 (ms) | int4 (ms) | int8 / float32 "
        "| int4 / float32 |"
    )
    print("| --- " * 8 + "|")
    return run(rounds)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 40)
