"""`python -m benchmarks.quantized_moe_decode`: GPT-OSS's experts as QMoE against float32.

The GPT-OSS-like keras_hub model of `benchmarks.moe_decode` (width 256, 4 layers, 8 query /
2 key-value heads of 32, 8 experts of intermediate 256 of which 2 a token, a window of 128
on every other layer, YaRN by 32, vocabulary 1024; keras_hub's initial weights) written by
`save_decoder` three times, cache 256: float32 (`com.microsoft.MoE`), int8 and int4 (block
32, accuracy_level 4: `QMoE` and `MatMulNBits`), the quantized files verified (their
agreement with the reference and with the float32 model is printed). Reported: the ONNX
bytes, ms/token through `og.Generator` (1 intra-op thread, batch 1, a prompt of 100 tokens
then 32 tokens) and one decode step in plain onnxruntime (1 thread, IOBinding, batch 1 and
4 at position 100), each the median over interleaved rounds in a random order, with the
median of the per-round ratios to float32.

    python -m benchmarks.quantized_moe_decode             # a few minutes on 2 cores
    python -m benchmarks.quantized_moe_decode --rounds 5
"""

from __future__ import annotations

import os

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import argparse  # noqa: E402
import random  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

from benchmarks.decode_floor import VOCABULARY, Bound  # noqa: E402
from benchmarks.moe_decode import HEAD_DIM, KV_HEADS, causal_lm  # noqa: E402
from benchmarks.quantized_decode import one_thread, onnx_bytes  # noqa: E402

MAX_LENGTH, PROMPT, TOKENS = 256, 100, 32
FILES = {"float32": None, "int8": "int8", "int4": "int4"}


def write(model, work: Path) -> dict:
    """`{name: folder}`, each verified but float32 (its MoE op verified in the tests)."""
    from keras_posenc.export import save_decoder

    folders = {}
    for name, mode in FILES.items():
        folders[name] = work / name
        report = save_decoder(
            model, folders[name], max_length=MAX_LENGTH, quantize=mode, verify=mode is not None,
            verbose=0, eos_token_id=VOCABULARY - 1,
        )  # fmt: skip
        for case in report.get("cases", []):
            for runtime, result in case["runtimes"].items():
                print(
                    f"{name} | {case['name']} | {runtime} | bound used "
                    f"{result.get('bound_used', float('nan')):.2f} | max |error| "
                    f"{result['max_abs_error']:.1e} | against float32 {result['against_float32']}"
                )
    return folders


def og_ms_per_token(model, prompt: np.ndarray) -> float:
    import time

    import onnxruntime_genai as og

    params = og.GeneratorParams(model)
    params.set_search_options(max_length=PROMPT + TOKENS + 1, do_sample=False)
    generator = og.Generator(model, params)
    generator.append_tokens(prompt[None].astype(np.int32))
    began = time.perf_counter()
    for _ in range(TOKENS):
        generator.generate_next_token()
    return (time.perf_counter() - began) / TOKENS * 1e3


def one_thread_session(folder: Path):
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    return onnxruntime.InferenceSession(
        str(folder / "model.onnx"), options, providers=["CPUExecutionProvider"]
    )


def interleaved(calls: dict, rounds: int, seed: int) -> dict:
    """`{name: (median, median ratio to float32)}` of `calls` timed in a random order."""
    times = {name: [] for name in calls}
    order = random.Random(seed)
    for call in calls.values():
        call()  # a warm-up each
    for _ in range(rounds):
        for name in order.sample(list(calls), len(calls)):
            times[name].append(calls[name]())
    return {
        name: (
            statistics.median(t),
            statistics.median(a / b for a, b in zip(t, times["float32"], strict=True)),
        )
        for name, t in times.items()
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args(argv)
    import onnxruntime_genai as og

    folders = write(causal_lm(), Path(tempfile.mkdtemp(prefix="quantized_moe_decode_")))
    for folder in folders.values():
        one_thread(folder)
    models = {name: og.Model(str(folder)) for name, folder in folders.items()}
    prompt = np.random.default_rng(0).integers(1, VOCABULARY - 1, PROMPT)
    calls = {name: lambda m=m: og_ms_per_token(m, prompt) for name, m in models.items()}
    result = {"og": interleaved(calls, args.rounds, 0)}
    print("| file | ONNX bytes | og ms/token | / float32 |")
    for name, (ms, ratio) in result["og"].items():
        print(f"| {name} | {onnx_bytes(folders[name]) / 2**20:.2f} MiB | {ms:.3f} | {ratio:.2f} |")
    sessions = {name: one_thread_session(folder) for name, folder in folders.items()}
    for batch in (1, 4):
        bound = {
            name: Bound(s, batch, PROMPT, (KV_HEADS, MAX_LENGTH, HEAD_DIM))
            for name, s in sessions.items()
        }
        timed = interleaved(bound, 10 * args.rounds, batch)
        result[f"onnxruntime batch {batch}"] = timed
        for name, (seconds, ratio) in timed.items():
            print(f"onnxruntime batch {batch} position {PROMPT} | {name} | "
                  f"{1e3 * seconds:.3f} ms | / float32 {ratio:.2f}")  # fmt: skip
    return result


if __name__ == "__main__":
    main()
