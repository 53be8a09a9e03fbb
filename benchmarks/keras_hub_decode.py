"""keras_hub CausalLMs exported by `save_decoder` against keras_hub's own XLA step (issue 25).

A tiny Llama and a tiny Gemma (width 256, 4 layers, 8 query / 2 key-value heads of 32,
MLP 768, vocabulary 1024, cache 1024; random weights), batch 1 and 4, one token per
row at positions ~100 and ~900: the exported ONNX step (`keras_posenc`, onnxruntime,
`intra_op_num_threads=1`, IOBinding with one buffer per layer bound as past and
present, as in `decode_floor.py`) and keras_hub's `call_with_cache` under
`tf.function(jit_compile=True)` (what its `generate()` compiles), and the genai
builder's graph of `gqa_reference.py` for a Llama-style step model of the same shapes
(it reads keras_posenc layers, not keras_hub's: other weights, the same ops and sizes;
a Llama-style MLP also against the Gemma), interleaved in a random order per round in
one process; median ms per step.

    python -m benchmarks.keras_hub_decode [--rounds 40]

The Llama graph is node for node the one `decode_floor.py` holds to 1.15x of the genai
builder's (the same emitter); a Gemma adds the embedding Mul and GeGLU's Gelu.
"""

from __future__ import annotations

import os

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import argparse  # noqa: E402
import random  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

from benchmarks.decode_floor import (  # noqa: E402
    MAX_LENGTH,
    SIZES,
    VOCABULARY,
    Bound,
    _session,
    step_model,
)

SIZE = dict(
    vocabulary_size=VOCABULARY,
    num_layers=4,
    num_query_heads=8,
    num_key_value_heads=2,
    hidden_dim=256,
    intermediate_dim=768,
)
HEAD_DIM, KV_HEADS = 32, 2


def causal_lm(family: str):
    import keras_hub

    if family == "llama":
        backbone = keras_hub.models.LlamaBackbone(**SIZE)
        return keras_hub.models.LlamaCausalLM(backbone=backbone)
    # GemmaBackbone's intermediate_dim is the gate and up width times 2.
    backbone = keras_hub.models.GemmaBackbone(
        **{**SIZE, "intermediate_dim": 2 * SIZE["intermediate_dim"]}, head_dim=HEAD_DIM
    )
    return keras_hub.models.GemmaCausalLM(backbone=backbone)


class XlaStep:
    """keras_hub's `call_with_cache` for one token per row, compiled once, at one position."""

    def __init__(self, model, batch: int, position: int):
        import tensorflow as tf

        layers = model.backbone.num_layers
        rng = np.random.default_rng(0)
        shape = (batch, layers, 2, MAX_LENGTH, KV_HEADS, HEAD_DIM)
        self.cache = tf.constant(rng.normal(size=shape).astype(np.float32))
        self.ids = tf.zeros((batch, 1), tf.int32)
        self.index = tf.constant(position, tf.int32)
        self.step = tf.function(model.call_with_cache, jit_compile=True)

    def __call__(self) -> float:
        start = time.perf_counter()
        logits, _, cache = self.step(self.ids, self.cache, self.index)
        logits.numpy()
        return time.perf_counter() - start


def compare(family: str, model, sessions: dict, batch: int, position: int, rounds: int) -> dict:
    kv_shape = (KV_HEADS, MAX_LENGTH, HEAD_DIM)
    calls = {kind: Bound(session, batch, position, kv_shape) for kind, session in sessions.items()}
    calls["keras_hub_xla"] = XlaStep(model, batch, position)
    for call in calls.values():
        call(), call()  # warm up (the XLA compilation)
    times = {kind: [] for kind in calls}
    rng = random.Random(position * 10 + batch)
    for _ in range(rounds):
        for kind in rng.sample(list(calls), len(calls)):
            times[kind].append(calls[kind]())
    medians = {kind: 1000 * statistics.median(t) for kind, t in times.items()}
    return {"family": family, "batch": batch, "position": position, **medians}


def main(rounds: int = 40) -> list[dict]:
    import keras

    from benchmarks.gqa_reference import reference_graph
    from keras_posenc.export.decoder import decoder_onnx
    from keras_posenc.keras_hub import describe_causal_lm

    columns = "ONNX (ms) | reference GQA (ms) | keras_hub XLA (ms) | ONNX / reference | ONNX / XLA"
    print(f"| family | batch | position | {columns} |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    keras.utils.set_random_seed(0)
    # The builder's graph of a Llama-style step model of the same shapes (gqa_reference
    # reads keras_posenc layers): the same ops and sizes, other weights; times only.
    reference = _session(reference_graph(step_model(SIZES["256x4"]), MAX_LENGTH))
    rows = []
    for family in ("llama", "gemma"):
        keras.utils.set_random_seed(0)
        model = causal_lm(family)
        sessions = {
            "keras_posenc": _session(decoder_onnx(describe_causal_lm(model, MAX_LENGTH))),
            "reference": reference,
        }
        for batch in (1, 4):
            for position in (100, 900):
                row = compare(family, model, sessions, batch, position, rounds)
                rows.append(row)
                ours, floor, xla = row["keras_posenc"], row["reference"], row["keras_hub_xla"]
                print(
                    f"| {family} | {batch} | {position} | {ours:.3f} | {floor:.3f} | {xla:.3f} "
                    f"| {ours / floor:.3f} | {ours / xla:.3f} |",
                    flush=True,
                )
    return rows


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m benchmarks.keras_hub_decode")
    parser.add_argument("--rounds", type=int, default=40)
    main(parser.parse_args().rounds)
