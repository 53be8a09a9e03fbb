"""`python -m benchmarks.quantized_decode`: int4 / int8 files, ours against the genai builder's.

One random-weight transformers `LlamaForCausalLM` (width 512, 4 layers, 8 query / 4
key-value heads of 64, SwiGLU 1408, vocabulary 4096, untied) saved to a folder, written
five ways: `save_decoder` float32, int8 and int4 (keras_hub's `LlamaCausalLM.from_preset`
of the folder; block 32, accuracy_level 4) and onnxruntime-genai's builder `-p int4 -e cpu`
and `-p fp32 -e cpu` of the same folder. Reported: the bytes of each folder's ONNX files,
and ms/token through `og.Generator` (1 intra-op thread, batch 1, a prompt of 100 tokens,
then 32 tokens: positions 100-131), the median over interleaved rounds in a random order.

    python -m benchmarks.quantized_decode            # a few minutes on 2 cores
    python -m benchmarks.quantized_decode --rounds 3
    python -m benchmarks.quantized_decode --part standard   # quantized_parts.py
    python -m benchmarks.quantized_decode --part standard --tied
    python -m benchmarks.quantized_decode --part levels
"""

from __future__ import annotations

import os

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import argparse  # noqa: E402
import json  # noqa: E402
import random  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

MAX_LENGTH, PROMPT, TOKENS = 256, 100, 32


def llama_folder(folder: Path, tied: bool = False) -> Path:
    """A random-weight transformers Llama saved as safetensors with its config (`tied`:
    the head is the embedding table)."""
    import torch
    import transformers

    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=4096,
        hidden_size=512,
        intermediate_size=1408,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=4,
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


def ours(hf: Path, out: Path, quantize: str | None, verify: bool) -> dict:
    import keras_hub

    from keras_posenc.export import save_decoder

    causal_lm = keras_hub.models.LlamaCausalLM.from_preset(
        str(hf), dtype="float32", preprocessor=None
    )
    began = time.perf_counter()
    report = save_decoder(
        causal_lm,
        out,
        max_length=MAX_LENGTH,
        quantize=quantize,
        verify=verify,
        verbose=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    return {"seconds": time.perf_counter() - began, "report": report}


def builder(hf: Path, out: Path, precision: str) -> None:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "onnxruntime_genai.models.builder",
            "-i",
            str(hf),
            "-o",
            str(out),
            "-p",
            precision,
            "-e",
            "cpu",
            "-c",
            str(out) + ".cache",
        ],
        check=True,
        capture_output=True,
    )


def one_thread(folder: Path) -> None:
    """Sets the decoder session's intra-op threads to 1 in `genai_config.json`."""
    path = folder / "genai_config.json"
    config = json.loads(path.read_text())
    options = config["model"]["decoder"].setdefault("session_options", {})
    options["intra_op_num_threads"] = 1
    options["inter_op_num_threads"] = 1
    path.write_text(json.dumps(config, indent=2))


def onnx_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.iterdir() if ".onnx" in p.name)


def ms_per_token(model, prompt: np.ndarray) -> float:
    import onnxruntime_genai as og

    params = og.GeneratorParams(model)
    params.set_search_options(max_length=PROMPT + TOKENS + 1, do_sample=False)
    generator = og.Generator(model, params)
    generator.append_tokens(prompt[None].astype(np.int32))
    began = time.perf_counter()
    for _ in range(TOKENS):
        generator.generate_next_token()
    return (time.perf_counter() - began) / TOKENS * 1e3


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--verify", action="store_true", help="verify our int4 file too")
    parser.add_argument(
        "--part",
        choices=("builder", "standard", "levels"),
        default="builder",
        help="standard: DequantizeLinear files; levels: MatMulNBits' accuracy levels",
    )
    parser.add_argument("--tied", action="store_true", help="--part standard: a tied head")
    args = parser.parse_args(argv)
    if args.part != "builder":
        from benchmarks import quantized_parts

        if args.part == "standard":
            return quantized_parts.standard_part(args.rounds, args.tied)
        return quantized_parts.levels_part(args.rounds)
    import onnxruntime_genai as og

    work = Path(tempfile.mkdtemp(prefix="quantized_decode_"))
    hf = llama_folder(work / "hf")
    folders = {}
    for name, quantize in (("ours float32", None), ("ours int8", "int8"), ("ours int4", "int4")):
        folders[name] = work / name.replace(" ", "_")
        result = ours(hf, folders[name], quantize, args.verify and quantize == "int4")
        print(f"{name}: written in {result['seconds']:.0f} s", file=sys.stderr)
    for name, precision in (("builder fp32", "fp32"), ("builder int4", "int4")):
        folders[name] = work / name.replace(" ", "_")
        builder(hf, folders[name], precision)
    models = {}
    for name, folder in folders.items():
        one_thread(folder)
        models[name] = og.Model(str(folder))
    prompt = np.random.default_rng(0).integers(3, 4096, PROMPT)
    times = {name: [] for name in models}
    for model in models.values():  # a warm-up each
        ms_per_token(model, prompt)
    order = list(models)
    for _ in range(args.rounds):
        random.shuffle(order)
        for name in order:
            times[name].append(ms_per_token(models[name], prompt))
    result = {
        name: {
            "bytes": onnx_bytes(folders[name]),
            "ms_per_token": statistics.median(times[name]),
        }
        for name in models
    }
    for name, row in result.items():
        print(f"{name:14s} {row['bytes'] / 2**20:8.2f} MiB {row['ms_per_token']:7.3f} ms/token")
    for a, b in (
        ("ours int4", "builder int4"),
        ("ours int4", "ours float32"),
        ("ours float32", "builder fp32"),
        ("ours int8", "ours float32"),
    ):
        print(
            f"{a} / {b}: bytes {result[a]['bytes'] / result[b]['bytes']:.3f}x, "
            f"ms/token {result[a]['ms_per_token'] / result[b]['ms_per_token']:.3f}x"
        )
    return result


if __name__ == "__main__":
    main()
