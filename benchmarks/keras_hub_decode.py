"""keras_hub CausalLMs exported by `save_decoder` against the genai builder's graph and keras_hub.

A tiny Llama, a tiny Gemma and a tiny Gemma with Gemma 2's settings (attention and final
soft caps, a window of 512 on every other layer, post norms), each width 256, 4 layers,
8 query / 2 key-value heads of 32, MLP 768, vocabulary 1024, cache 1024, keras_hub's
random weights; batch 1 and 4, one token per row at positions ~100 and ~900. Timed,
interleaved in a random order per round in one process, median ms per step:

- `keras_posenc`: the exported ONNX step (`decoder_onnx` of `describe_causal_lm`, what
  `save_decoder` writes) in onnxruntime, `intra_op_num_threads=1`, IOBinding with one
  buffer per layer bound as past and present, as in `decode_floor.py`;
- `reference`: the genai builder's graph of `gqa_reference.py` made from the same
  `Decoder` description (the same weights, RoPE tables, query scale, soft caps, windows
  and norms), run the same way; their logits' largest difference is reported;
- `keras_hub generate`: keras_hub's own `generate_step` (the greedy sampler's loop,
  `tf.function(jit_compile=True)` as its `generate()` compiles it), per generated token:
  the difference of two runs over the same `position + 16` tokens, one generating the
  last 16 and one generating none (both prefill all of them, as keras_hub does), over 16;
- `keras_hub call_with_cache`: one `call_with_cache` under `tf.function(jit_compile=True)`,
  a new cache returned per call (an upper bound of generate's step).

The XLA runs get every thread of the machine; the ONNX sessions one, and in each round
each ONNX session runs 5 times back to back (the round's time their median: the first
step after an XLA run is slowed by it, whichever graph it is).

    PYTHONPATH=.:tests python -m benchmarks.keras_hub_decode [--rounds 40]
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

from benchmarks.decode_floor import MAX_LENGTH, VOCABULARY, Bound, _session  # noqa: E402

SIZE = dict(
    vocabulary_size=VOCABULARY,
    num_layers=4,
    num_query_heads=8,
    num_key_value_heads=2,
    hidden_dim=256,
    intermediate_dim=768,
)
HEAD_DIM, KV_HEADS = 32, 2
GENERATED = 16  # tokens per timed generate_step run
ONNX_REPEATS = 5  # back-to-back ONNX calls per round (their median is the round's time)
GEMMA2 = dict(
    use_post_ffw_norm=True,
    use_post_attention_norm=True,
    attention_logit_soft_cap=50.0,
    final_logit_soft_cap=30.0,
    use_sliding_window_attention=True,
    sliding_window_size=512,
)
FAMILIES = ("llama", "gemma", "gemma2")


def causal_lm(family: str):
    import keras_hub

    if family == "llama":
        backbone = keras_hub.models.LlamaBackbone(**SIZE)
        return keras_hub.models.LlamaCausalLM(backbone=backbone, preprocessor=None)
    # GemmaBackbone's intermediate_dim is the gate and up width times 2.
    options = {**SIZE, "intermediate_dim": 2 * SIZE["intermediate_dim"], "head_dim": HEAD_DIM}
    if family == "gemma2":
        options.update(GEMMA2)
    backbone = keras_hub.models.GemmaBackbone(**options)
    return keras_hub.models.GemmaCausalLM(backbone=backbone, preprocessor=None)


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


class Generate:
    """keras_hub's compiled greedy `generate_step` over `position + GENERATED` tokens, of
    which the first `prompt` are given (`GENERATED` or 0 generated)."""

    def __init__(self, model, batch: int, position: int, generated: int):
        import tensorflow as tf

        length = position + GENERATED
        self.function = model.make_generate_function()
        self.inputs = {
            "token_ids": tf.ones((batch, length), tf.int32),
            "padding_mask": tf.sequence_mask([length - generated] * batch, length),
        }

    def __call__(self) -> float:
        start = time.perf_counter()
        self.function(self.inputs, stop_token_ids=None)["token_ids"].numpy()
        return time.perf_counter() - start


def compare(family: str, model, sessions: dict, batch: int, position: int, rounds: int) -> dict:
    kv_shape = (KV_HEADS, MAX_LENGTH, HEAD_DIM)
    calls = {kind: Bound(session, batch, position, kv_shape) for kind, session in sessions.items()}
    calls["call_with_cache"] = XlaStep(model, batch, position)
    calls["generate"] = Generate(model, batch, position, GENERATED)
    calls["prefill_only"] = Generate(model, batch, position, 0)
    for call in calls.values():
        call(), call()  # warm up (the XLA compilations)
    times = {kind: [] for kind in calls}
    rng = random.Random(position * 10 + batch)
    for _ in range(rounds):
        for kind in rng.sample(list(calls), len(calls)):
            # An ONNX step right after an XLA run (every thread, another working set) is
            # slowed by it: the median of a few back-to-back calls is the step's own time.
            repeats = ONNX_REPEATS if kind in sessions else 1
            times[kind].append(statistics.median(calls[kind]() for _ in range(repeats)))
    medians = {kind: 1000 * statistics.median(t) for kind, t in times.items()}
    generate_step = (medians.pop("generate") - medians.pop("prefill_only")) / GENERATED
    ours, theirs = (calls[kind].logits.numpy() for kind in ("keras_posenc", "reference"))
    return {
        "family": family,
        "batch": batch,
        "position": position,
        **medians,
        "generate_step": generate_step,
        "max_logit_diff": float(np.abs(ours - theirs).max()),
    }


def main(rounds: int = 40) -> list[dict]:
    import keras

    from benchmarks.gqa_reference import reference_graph
    from keras_posenc.export.decoder import decoder_onnx
    from keras_posenc.keras_hub import describe_causal_lm

    columns = (
        "ONNX (ms) | reference GQA (ms) | ONNX / reference | max logit diff | "
        "keras_hub generate step (ms) | ONNX / generate | keras_hub call_with_cache (ms)"
    )
    print(f"| family | batch | position | {columns} |")
    print("| --- " * 10 + "|")
    rows = []
    for family in FAMILIES:
        keras.utils.set_random_seed(0)
        model = causal_lm(family)
        model.compile(sampler="greedy")
        decoder = describe_causal_lm(model, MAX_LENGTH)
        sessions = {
            "keras_posenc": _session(decoder_onnx(decoder)),
            "reference": _session(reference_graph(decoder)),
        }
        for batch in (1, 4):
            for position in (100, 900):
                row = compare(family, model, sessions, batch, position, rounds)
                rows.append(row)
                ours, floor = row["keras_posenc"], row["reference"]
                step, call = row["generate_step"], row["call_with_cache"]
                print(
                    f"| {family} | {batch} | {position} | {ours:.3f} | {floor:.3f} | "
                    f"{ours / floor:.3f} | {row['max_logit_diff']:.1e} | {step:.3f} | "
                    f"{ours / step:.3f} | {call:.3f} |",
                    flush=True,
                )
    return rows


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m benchmarks.keras_hub_decode")
    parser.add_argument("--rounds", type=int, default=40)
    main(parser.parse_args().rounds)
