"""`python -m benchmarks.quantized_decode --part standard | levels`: two more quantized parts.

On `quantized_decode.py`'s random transformers Llama (width 512, 4 layers, vocabulary
4096, untied; ours through keras_hub's `LlamaCausalLM.from_preset`), block 32:

- `standard`: `attention="standard"` files (DequantizeLinear + MatMul) at int4 and int8,
  interleaved with the standard float32 file and the GroupQueryAttention files of the same
  weights (float32, and MatMulNBits at accuracy_level 4). Reported: bytes, what onnxruntime
  makes of each quantized file (its optimized model's MatMul-like nodes and their accuracy
  levels, `SessionOptions.optimized_model_filepath`, one thread) and ms/token through
  `og.Generator`. `--tied`: the same with a tied head (the standard files' embedding an
  int8 copy of the head's integers, `quantized_standard.tied_lookup`).
- `levels`: the GroupQueryAttention int4 file at each MatMulNBits `accuracy_level` (0-4,
  rewritten in copies of one file), ms/token interleaved, and each level's prompt logits
  (4 prompts of 100 tokens, teacher-forced, plain onnxruntime) against level 0's (the
  stored weights in float arithmetic), and the float32 file's top-1 agreement.

ms/token: 1 intra-op thread, batch 1, a prompt of 100 tokens then 32 tokens, each round
every file once in a random order; the medians of the per-round ratios to a baseline, and
`/proc/loadavg` before and after.
"""

from __future__ import annotations

import collections
import random
import shutil
import statistics
import tempfile
from pathlib import Path

import numpy as np

from benchmarks.quantized_decode import (
    PROMPT,
    llama_folder,
    ms_per_token,
    one_thread,
    onnx_bytes,
)

MAX_LENGTH = 256  # the files' cache: the prompt and a few rounds of tokens


def _load() -> str:
    with open("/proc/loadavg") as file:
        return " ".join(file.read().split()[:3])


def _write(hf: Path, out: Path, attention: str, quantize: str | None) -> Path:
    import keras_hub

    from keras_posenc.export import save_decoder

    causal_lm = keras_hub.models.LlamaCausalLM.from_preset(
        str(hf), dtype="float32", preprocessor=None
    )
    save_decoder(
        causal_lm,
        out,
        max_length=MAX_LENGTH,
        attention=attention,
        quantize=quantize,
        verify=False,
        verbose=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    return out


def optimized_node_types(path: Path, work: Path) -> dict:
    """The node types of onnxruntime's optimized model of `path` (CPU, 1 thread)."""
    import onnx
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = 1
    options.log_severity_level = 3
    options.optimized_model_filepath = str(work / f"{path.parent.name}.optimized.onnx")
    onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    model = onnx.load(options.optimized_model_filepath)
    types = collections.Counter(node.op_type for node in model.graph.node)
    levels = {
        attribute.i
        for node in model.graph.node
        if node.op_type == "MatMulNBits"
        for attribute in node.attribute
        if attribute.name == "accuracy_level"
    }
    return {**types, "accuracy levels": sorted(levels)}


def interleaved(folders: dict, baseline: str, rounds: int) -> dict:
    """`{name: {"ms_per_token", "ratio"}}`: medians over rounds, `ratio` the median of the
    per-round ratios to `baseline`."""
    import onnxruntime_genai as og

    models = {}
    for name, folder in folders.items():
        one_thread(folder)
        models[name] = og.Model(str(folder))
    prompt = np.random.default_rng(0).integers(3, 4096, PROMPT)
    for model in models.values():  # a warm-up each
        ms_per_token(model, prompt)
    times = {name: [] for name in models}
    order = list(models)
    for _ in range(rounds):
        random.shuffle(order)
        for name in order:
            times[name].append(ms_per_token(models[name], prompt))
    return {
        name: {
            "ms_per_token": statistics.median(times[name]),
            "ratio": statistics.median(
                a / b for a, b in zip(times[name], times[baseline], strict=True)
            ),
        }
        for name in models
    }


def _print(result: dict, baseline: str, load: tuple) -> None:
    for name, row in result.items():
        print(f"{name:26s} {row['ms_per_token']:7.3f} ms/token  {row['ratio']:.3f}x {baseline}")
    print(f"load average before: {load[0]}, after: {load[1]}")


def standard_part(rounds: int, tied: bool = False) -> dict:
    """The `standard` part (module docstring); `tied`: the Llama's head is its table."""
    work = Path(tempfile.mkdtemp(prefix="quantized_standard_"))
    hf = llama_folder(work / "hf", tied)
    folders = {}
    for mode in ("float32", "int8", "int4"):
        quantize = None if mode == "float32" else mode
        for attention in ("standard", "gqa"):
            folder = work / f"{attention}_{mode}"
            folders[f"{attention} {mode}"] = _write(hf, folder, attention, quantize)
    for name, folder in folders.items():
        types = optimized_node_types(folder / "model.onnx", work) if "int" in name else {}
        print(f"{name}: {onnx_bytes(folder) / 2**20:.2f} MiB", end="")
        kept = ("MatMulNBits", "accuracy levels", "DequantizeLinear", "MatMul")
        fused = {t: types[t] for t in kept if t in types}
        print(f", optimized by onnxruntime: {fused}" if types else "")
    load = [_load()]
    result = interleaved(folders, "standard float32", rounds)
    load.append(_load())
    _print(result, "standard float32", load)
    for mode in ("float32", "int8", "int4"):
        a, b = result[f"standard {mode}"], result[f"gqa {mode}"]
        print(f"standard {mode} / gqa {mode}: {a['ratio'] / b['ratio']:.3f}x (median ratios)")
    shutil.rmtree(work, ignore_errors=True)
    return result


def _prompt_logits(path: Path, prompts: np.ndarray) -> np.ndarray:
    import onnx
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = 1
    session = onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    feeds = {"input_ids": prompts, "attention_mask": np.ones_like(prompts)}
    for value in onnx.load(path, load_external_data=False).graph.input:
        if value.name.startswith("past_key_values"):
            heads, _, dim = (d.dim_value for d in value.type.tensor_type.shape.dim[1:])
            feeds[value.name] = np.zeros((len(prompts), heads, MAX_LENGTH, dim), np.float32)
    return session.run(["logits"], feeds)[0].astype(np.float64)


def _with_level(written: Path, folder: Path, level: int) -> Path:
    """A copy of the folder `written` with every MatMulNBits at `level`."""
    import onnx

    shutil.copytree(written, folder)
    model = onnx.load(folder / "model.onnx")
    for node in model.graph.node:
        for attribute in node.attribute:
            if node.op_type == "MatMulNBits" and attribute.name == "accuracy_level":
                attribute.i = level
    onnx.save(model, folder / "model.onnx")
    return folder


def _agreement(folders: dict, exact: Path, float32: Path, layers: int) -> None:
    """Each file's prompt logits against `exact`'s (level 0) and the float32 file's."""
    from keras_posenc.export.decoder.quantized_check import activation_bound

    prompts = np.random.default_rng(1).integers(3, 4096, (4, PROMPT)).astype(np.int64)
    reference = _prompt_logits(exact / "model.onnx", prompts)
    float_logits = _prompt_logits(float32 / "model.onnx", prompts)
    scale = np.sqrt(np.mean(np.square(reference), axis=-1, keepdims=True))
    bound = activation_bound(reference, 2 * layers + 1, 32)
    for name, folder in folders.items():
        logits = _prompt_logits(folder / "model.onnx", prompts)
        error = np.abs(logits - reference)
        same = np.mean(np.argmax(logits, -1) == np.argmax(reference, -1))
        against_float = np.mean(np.argmax(logits, -1) == np.argmax(float_logits, -1))
        print(
            f"{name}: max |logit - level 0's| / rms(row) {(error / scale).max():.2e} "
            f"(int8-activation bound used {(error / bound).max():.2f}), top-1 as level 0 "
            f"{same:.1%}, as float32 {against_float:.1%}"
        )


def levels_part(rounds: int) -> dict:
    """The `levels` part (module docstring), int4 and int8."""
    work = Path(tempfile.mkdtemp(prefix="quantized_levels_"))
    hf = llama_folder(work / "hf")
    float32 = _write(hf, work / "gqa_float32", "gqa", None)
    folders = {}
    for mode in ("int4", "int8"):
        written = _write(hf, work / f"gqa_{mode}", "gqa", mode)
        named = {
            f"{mode}, accuracy_level {level}": _with_level(
                written, work / f"{mode}_level_{level}", level
            )
            for level in range(5)
        }
        _agreement(named, named[f"{mode}, accuracy_level 0"], float32, layers=4)
        folders.update(named)
    load = [_load()]
    result = interleaved(folders, "int4, accuracy_level 4", rounds)
    load.append(_load())
    _print(result, "int4, accuracy_level 4", load)
    for mode in ("int4", "int8"):
        level_4 = result[f"{mode}, accuracy_level 4"]["ratio"]
        ratios = [result[f"{mode}, accuracy_level {n}"]["ratio"] / level_4 for n in range(5)]
        print(f"{mode}, each level / level 4: " + ", ".join(f"{r:.2f}x" for r in ratios))
    shutil.rmtree(work, ignore_errors=True)
    return result
