"""`python -m benchmarks.decode --part quantized`: int4 / int8 files, ours and the builder's.

Per size, one random-weight transformers `LlamaForCausalLM` (untied, vocabulary and
widths in `SIZES`) saved to a folder and written four ways: onnxruntime-genai's builder
`-p int4 -e cpu` and `-p int8 -e cpu` of the folder, and `save_decoder(quantize="int4" |
"int8")` of keras_hub's `LlamaCausalLM.from_preset` of the same folder, at the block size
and `accuracy_level` the builder's `MatMulNBits` nodes carry (read from its files). Each
part is written by a child process of its own (its memory given back before the next).

Timed through `og.Generator` (1 intra-op thread), per batch (1, 4) and position (~100,
~900), in a process per group (`GROUPS`: the int4 files, the int8 files) that loads its
files in a random order: every file's generator is given the same random prompt once,
then each round (the files in a random order) times the next `TOKENS` tokens of each, so
that a round times the same positions in every file (`og.Generator` rewinds only batch 1;
the positions move by `TOKENS` a round: 100-196 and 900-996 at 15 rounds). Reported: the
bytes of each folder's ONNX files (with their external data), the median ms/token, and
the median over rounds of ours / the builder's ms/token, per bits, each in wall time and
in the CPU time of the thread that runs the session (`timed_round`; on a shared,
oversubscribed machine wall time is mostly the other processes'), beside an A/A control:
the builder's int4 folder loaded twice, one against the other.

    python -m benchmarks.decode --part quantized            # both sizes, the full grid
    python -m benchmarks.decode --part quantized --quick    # the small size, batch 1, ~100
    python -m benchmarks.quantized_decode --keep /tmp/q     # the same, the files kept
    python -m benchmarks.quantized_decode --part standard [--tied] | --part levels
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

TOKENS = 6
PROMPT = 100  # the prompt of `ms_per_token`
# name -> transformers LlamaConfig arguments (8 / 4 heads of 64 or 12 / 4 of 64).
SIZES = {
    "21M": dict(
        vocab_size=4096,
        hidden_size=512,
        intermediate_size=1408,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=4,
    ),
    "124M": dict(
        vocab_size=32000,
        hidden_size=768,
        intermediate_size=2048,
        num_hidden_layers=12,
        num_attention_heads=12,
        num_key_value_heads=4,
    ),
}
MAX_LENGTH = 1280
BITS = {"int4": 4, "int8": 8}
# Ratios reported per cell: ours / the builder's per bits, and an A/A control: the builder's
# int4 folder loaded a second time against itself (what a file's placement in memory and the
# machine's noise alone give).
PAIRS = {
    "int4": ("ours_int4", "builder_int4"),
    "int8": ("ours_int8", "builder_int8"),
    "A/A": ("builder_int4_again", "builder_int4"),
}
# The files timed together, one process each (five generators at once at batch 4, position
# 900 took one process to 4.8 GB at 124M).
GROUPS = {
    "int4": ("ours_int4", "builder_int4", "builder_int4_again"),
    "int8": ("ours_int8", "builder_int8"),
}


def llama_folder(folder: Path, tied: bool = False, size: str = "21M") -> Path:
    """A random-weight transformers Llama of `SIZES[size]` saved as safetensors, its config
    and a tokenizer (`tied`: the head is the embedding table)."""
    import torch
    import transformers

    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        **SIZES[size],
        max_position_embeddings=MAX_LENGTH,
        tie_word_embeddings=tied,
        bos_token_id=1,
        eos_token_id=2,
    )
    model = transformers.LlamaForCausalLM(config).eval()
    model.save_pretrained(folder)
    tokenizer(config.vocab_size).save_pretrained(folder)  # the builder writes its files
    return folder


def tokenizer(vocabulary: int):
    """A word-level fast tokenizer of `vocabulary` made-up words (the builder needs one)."""
    import tokenizers
    import transformers

    words = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"w{i}": i for i in range(3, vocabulary)}}
    model = tokenizers.Tokenizer(tokenizers.models.WordLevel(words, unk_token="<unk>"))
    model.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=model, unk_token="<unk>", bos_token="<s>", eos_token="</s>"
    )


def builder(hf: Path, out: Path, precision: str) -> None:
    command = [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(hf)]
    command += ["-o", str(out), "-p", precision, "-e", "cpu", "-c", str(out) + ".cache"]
    subprocess.run(command, check=True, capture_output=True)


def matmul_settings(folder: Path) -> dict:
    """The bits, block size and accuracy_level of a folder's `MatMulNBits` nodes (one set)."""
    import onnx

    path = next(p for p in folder.iterdir() if p.suffix == ".onnx")
    model = onnx.load(str(path), load_external_data=False)
    found = set()
    for node in model.graph.node:
        if node.op_type == "MatMulNBits":
            attributes = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
            found.add(tuple(attributes.get(k, 0) for k in ("bits", "block_size", "accuracy_level")))
    if len(found) != 1:
        raise RuntimeError(f"{folder.name}: MatMulNBits settings {sorted(found)}, not one set")
    bits, block_size, accuracy_level = found.pop()
    return {"bits": bits, "block_size": block_size, "accuracy_level": accuracy_level}


def ours(hf: Path, out: Path, quantize: str, settings: dict) -> None:
    import keras_hub

    from keras_posenc.export import save_decoder

    causal_lm = keras_hub.models.LlamaCausalLM.from_preset(
        str(hf), dtype="float32", preprocessor=None
    )
    save_decoder(
        causal_lm,
        out,
        max_length=MAX_LENGTH,
        quantize=quantize,
        block_size=settings["block_size"],
        accuracy_level=settings["accuracy_level"],
        verify=False,
        verbose=0,
        bos_token_id=1,
        eos_token_id=2,
    )


def write(size: str, work: Path, part: str) -> None:
    """One part of a size's files, in a process of its own (each under 3 GB at 124M):
    `hf` the transformers folder, then per precision `int4` / `int8` the builder's file
    (its own process) and ours at the settings read from it."""
    os.environ.setdefault("KERAS_BACKEND", "tensorflow")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    hf = work / "hf"
    if part == "hf":
        llama_folder(hf, size=size)
        return
    builder(hf, work / f"builder_{part}", part)
    settings = matmul_settings(work / f"builder_{part}")
    if settings["bits"] != BITS[part]:
        raise RuntimeError(f"the builder's -p {part} wrote {settings}")
    ours(hf, work / f"ours_{part}", part, settings)
    if matmul_settings(work / f"ours_{part}") != settings:
        raise RuntimeError(f"ours {part}: {matmul_settings(work / f'ours_{part}')}")
    (work / f"settings_{part}.json").write_text(json.dumps(settings))


def one_thread(folder: Path, arena: bool = True) -> None:
    """Sets the decoder session's intra-op threads to 1 in `genai_config.json`, and its CPU
    memory arena on (onnxruntime's default) or off (each arena keeps its largest step; at
    124M the timing process peaked at 4.8 GB with the arenas, 4.1 GB without)."""
    path = folder / "genai_config.json"
    config = json.loads(path.read_text())
    options = config["model"]["decoder"].setdefault("session_options", {})
    options["intra_op_num_threads"] = 1
    options["inter_op_num_threads"] = 1
    options["enable_cpu_mem_arena"] = arena
    path.write_text(json.dumps(config, indent=2))


def onnx_bytes(folder: Path) -> int:
    """The ONNX graph and its external data (`*.onnx*`), what a user downloads and maps."""
    return sum(p.stat().st_size for p in folder.iterdir() if ".onnx" in p.name)


def generator(model, prompt: np.ndarray, rounds: int):
    """A generator given `prompt` (batch, position), with room for `rounds` of `TOKENS`."""
    import onnxruntime_genai as og

    params = og.GeneratorParams(model)
    params.set_search_options(
        batch_size=prompt.shape[0],
        max_length=prompt.shape[1] + rounds * TOKENS + 1,
        do_sample=False,
    )
    state = og.Generator(model, params)
    state.append_tokens(prompt.astype(np.int32))
    return state


def timed_round(state) -> tuple[float, float]:
    """Wall and CPU ms per token of the next `TOKENS` tokens. With one intra-op thread
    onnxruntime runs every node on the calling thread, so its CPU time is the step's work
    without the time the shared machine gave to other processes."""
    wall, cpu = time.perf_counter(), time.thread_time()
    for _ in range(TOKENS):
        state.generate_next_token()
    return (time.perf_counter() - wall) / TOKENS * 1e3, (time.thread_time() - cpu) / TOKENS * 1e3


def ms_per_token(model, prompt: np.ndarray) -> float:
    """Wall ms per token of `TOKENS` tokens after `prompt` (one row) in a new generator."""
    return timed_round(generator(model, prompt[None], 1))[0]


def cell(models: dict, batch: int, position: int, rounds: int, vocabulary: int) -> dict:
    """One batch and position: each file's ms/token per round, interleaved."""
    prompt = np.random.default_rng(position + batch).integers(3, vocabulary, (batch, position))
    # The caches allocated in a random order (the first allocation can land differently).
    states = {name: generator(models[name], prompt, rounds + 1) for name in shuffled(models)}
    times = {name: [] for name in models}  # (wall, cpu) per round
    order = list(models)
    for state in states.values():  # a warm-up each
        timed_round(state)
    for _ in range(rounds):
        random.shuffle(order)
        for name in order:
            times[name].append(timed_round(states[name]))
    row = {}
    for clock, at in (("wall", 0), ("cpu", 1)):
        row[clock] = {name: statistics.median(t[at] for t in times[name]) for name in models}
        for pair, (ours_name, theirs) in PAIRS.items():
            if ours_name not in times:
                continue
            pairs = zip(times[ours_name], times[theirs], strict=True)
            row[clock][f"ratio {pair}"] = statistics.median(a[at] / b[at] for a, b in pairs)
    return row


def shuffled(names) -> list:
    return random.sample(list(names), len(names))


def run_size(
    size: str, batches, positions, rounds: int, keep: Path | None, arena: bool = True
) -> dict:
    """Writes the size's files (under `keep / size`, kept and reused, or a temporary
    folder), then times every batch and position, a child process per group of files."""
    work = (
        Path(tempfile.mkdtemp(prefix=f"quantized_decode_{size}_")) if keep is None else keep / size
    )
    if not (work / "settings.json").exists():
        began = time.perf_counter()
        command = [sys.executable, "-m", "benchmarks.quantized_decode", "--write", size, str(work)]
        for part in ("hf", *BITS):
            subprocess.run([*command, part], check=True)
        settings = {p: json.loads((work / f"settings_{p}.json").read_text()) for p in BITS}
        (work / "settings.json").write_text(json.dumps(settings))
        print(f"{size}: written in {time.perf_counter() - began:.0f} s", file=sys.stderr)
    settings = json.loads((work / "settings.json").read_text())
    names = [f"{who}_{p}" for p in BITS for who in ("ours", "builder")]
    result = {"settings": settings, "bytes": {n: onnx_bytes(work / n) for n in names}}
    command = [sys.executable, "-m", "benchmarks.quantized_decode", "--rounds", str(rounds)]
    command += ["--batches", *map(str, batches), "--positions", *map(str, positions)]
    command += [] if arena else ["--no-arena"]
    for group in GROUPS:
        subprocess.run([*command, "--time", size, str(work), group], check=True)
    for batch in batches:
        for position in positions:
            key, row = f"batch {batch}, position {position}", {"wall": {}, "cpu": {}}
            for group in GROUPS:
                timed = json.loads((work / f"times_{group}.json").read_text())[key]
                for clock in row:
                    row[clock].update(timed[clock])
            result[key] = row
            report_cell(size, batch, position, row)
    return result


def time_group(size: str, work: Path, group: str, batches, positions, rounds, arena) -> None:
    """Times one group's files in this process; writes `work/times_<group>.json`."""
    import onnxruntime_genai as og

    models = {}
    for name in shuffled(GROUPS[group]):  # loaded in a random order
        folder = work / name.removesuffix("_again")
        one_thread(folder, arena)
        models[name] = og.Model(str(folder))
    result = {}
    for batch in batches:
        for position in positions:
            row = cell(models, batch, position, rounds, SIZES[size]["vocab_size"])
            result[f"batch {batch}, position {position}"] = row
    (work / f"times_{group}.json").write_text(json.dumps(result))


def report_cell(size: str, batch: int, position: int, row: dict) -> None:
    for clock, times in row.items():
        ms = "  ".join(f"{n} {times[n]:.3f}" for n in times if not n.startswith("ratio"))
        ratios = "  ".join(
            f"{p} {times[f'ratio {p}']:.3f}x" for p in PAIRS if f"ratio {p}" in times
        )
        where = f"{size} batch {batch}, position {position}, {clock}"
        print(f"{where} ms/token: {ms}; ours / builder {ratios}")


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--quick", action="store_true", help="21M, batch 1, position ~100")
    parser.add_argument("--sizes", nargs="+", choices=SIZES, default=list(SIZES))
    parser.add_argument(
        "--no-arena", dest="arena", action="store_false", help="onnxruntime's CPU arena off"
    )
    parser.add_argument("--keep", type=Path, help="write the files under KEEP/<size>, reuse them")
    parser.add_argument("--write", nargs=3, help=argparse.SUPPRESS)  # SIZE FOLDER PART
    parser.add_argument("--time", nargs=3, help=argparse.SUPPRESS)  # SIZE FOLDER GROUP
    parser.add_argument("--batches", nargs="+", type=int, default=[1, 4], help=argparse.SUPPRESS)
    parser.add_argument(
        "--positions", nargs="+", type=int, default=[100, 900], help=argparse.SUPPRESS
    )
    parser.add_argument(
        "--part",
        choices=("builder", "standard", "levels"),
        default="builder",
        help="standard: DequantizeLinear files (quantized_parts.py); levels: accuracy levels",
    )
    parser.add_argument("--tied", action="store_true", help="--part standard: a tied head")
    args = parser.parse_args(argv)
    if args.part != "builder":
        from benchmarks import quantized_parts

        if args.part == "standard":
            return quantized_parts.standard_part(args.rounds, args.tied)
        return quantized_parts.levels_part(args.rounds)
    if args.time:
        size, folder, group = args.time
        time_group(size, Path(folder), group, args.batches, args.positions, args.rounds, args.arena)
        return {}
    if args.write:
        size, folder, part = args.write
        write(size, Path(folder), part)
        return {}
    sizes, batches, positions = (
        (["21M"], [1], [100]) if args.quick else (args.sizes, [1, 4], [100, 900])
    )
    print(f"load average {open('/proc/loadavg').read().strip()}")
    results = {}
    for size in sizes:
        results[size] = run_size(
            size, batches, positions, 3 if args.quick else args.rounds, args.keep, args.arena
        )
        sizes_of = results[size]["bytes"]
        for precision in BITS:
            ours_bytes, theirs = sizes_of[f"ours_{precision}"], sizes_of[f"builder_{precision}"]
            print(
                f"{size} {precision} ({results[size]['settings'][precision]}): ours "
                f"{ours_bytes / 2**20:.2f} MiB, builder {theirs / 2**20:.2f} MiB: "
                f"{ours_bytes / theirs:.4f}x"
            )
    print(f"load average {open('/proc/loadavg').read().strip()}")
    return results


if __name__ == "__main__":
    main()
