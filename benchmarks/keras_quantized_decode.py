"""`python -m benchmarks.keras_quantized_decode`: Keras-quantized files against our own
quantize-at-export of the same float model (bytes and decode ms/token).

A random keras_hub Llama (width 512, 4 layers, 8 query / 4 key-value heads of 64, SwiGLU
1408, vocabulary 4096, untied) written five ways by `save_decoder` (verify=False: the
tests verify): float32, `quantize="int8"` and `"int4"` (block 32, accuracy_level 4), and
the same model quantized by Keras (`quantize("int8")`, `quantize("int4")`: block 128). Each
file decodes 32 tokens after a 100-token prompt in onnxruntime (1 intra-op thread, batch
1, `greedy_generation.onnx_greedy`); rounds interleave the files in a random order, and the
median ms/token of each and its ratio to our int4's are printed with the load average.

    python -m benchmarks.keras_quantized_decode --rounds 5
"""

from __future__ import annotations

import os

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import argparse  # noqa: E402
import random  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402
from pathlib import Path  # noqa: E402

PROMPT, STEPS, MAX_LENGTH = 100, 32, 160


def _model(quantized: str | None):
    import keras
    import keras_hub

    keras.utils.set_random_seed(0)
    backbone = keras_hub.models.LlamaBackbone(
        vocabulary_size=4096,
        num_layers=4,
        hidden_dim=512,
        intermediate_dim=1408,
        num_query_heads=8,
        num_key_value_heads=4,
        tie_word_embeddings=False,
    )
    causal_lm = keras_hub.models.LlamaCausalLM(backbone, preprocessor=None)
    if quantized:
        causal_lm.quantize(quantized)
    return causal_lm


def _bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.glob("model.onnx*"))


def main() -> None:
    import numpy as np
    import onnxruntime

    from keras_posenc.export import save_decoder
    from keras_posenc.export.decoder.greedy_generation import onnx_greedy

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    kinds = {
        "ours float32": (None, {}),
        "ours int8": (None, {"quantize": "int8"}),
        "ours int4": (None, {"quantize": "int4"}),
        "Keras int8": ("int8", {}),
        "Keras int4": ("int4", {}),
    }
    sessions, sizes = {}, {}
    with tempfile.TemporaryDirectory() as root:
        for name, (keras_mode, options) in kinds.items():
            folder = Path(root) / name.replace(" ", "_")
            save_decoder(
                _model(keras_mode),
                folder,
                max_length=MAX_LENGTH,
                verify=False,
                verbose=0,
                **options,
            )
            sizes[name] = _bytes(folder)
            settings = onnxruntime.SessionOptions()
            settings.intra_op_num_threads = 1
            sessions[name] = onnxruntime.InferenceSession(
                str(folder / "model.onnx"), settings, providers=["CPUExecutionProvider"]
            )
        prompts = np.random.default_rng(0).integers(0, 4096, (1, PROMPT)).astype(np.int64)
        mask = np.ones_like(prompts)
        times = {name: [] for name in kinds}
        for _ in range(args.rounds):
            order = list(kinds)
            random.shuffle(order)
            for name in order:
                start = time.perf_counter()
                onnx_greedy(sessions[name], prompts, mask, STEPS, MAX_LENGTH)
                times[name].append((time.perf_counter() - start) * 1000 / (STEPS + 1))
    load = open("/proc/loadavg").read().split()[:3]
    base = statistics.median(times["ours int4"])
    print(f"load average {' '.join(load)}; prompt {PROMPT} + {STEPS} tokens, 1 thread")
    for name in kinds:
        median = statistics.median(times[name])
        print(
            f"{name:14s} {sizes[name] / 2**20:7.2f} MiB  {median:7.3f} ms/token "
            f"({median / base:.2f}x ours int4)"
        )


if __name__ == "__main__":
    main()
