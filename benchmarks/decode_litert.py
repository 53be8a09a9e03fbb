"""The LiteRT decode step against TensorFlow's XLA step, and the XLA step against the GQA graph.

The sizes of `decode_floor.py` (width 256, 4 layers, heads of 32; width 512, 8 layers,
heads of 64; 8 query / 2 key-value heads, vocabulary 1024, cache 1024), batch 1 and 4,
one token per row at positions ~100 and ~900, one thread each, interleaved in a random
order per round in one process:

- `litert`: `save_decoder`'s `model.tflite`, its `decode` signature (`Invoke` only: the
  inputs, caches included, are set once; XNNPACK, `num_threads=1`);
- `xla`: the Keras step model under `tf.function(jit_compile=True)` (intra-op threads 1),
  the call and the logits back on the host;
- `gqa`: the genai-style reference graph of `gqa_reference.py` in onnxruntime
  (IOBinding, one buffer per layer bound as past and present).

Caches hold random numbers; the timed step does the work of position `p` (the mask and
the update index), whatever the cache holds.
"""

from __future__ import annotations

import random
import statistics
import time

import numpy as np

from benchmarks.decode_floor import KV_HEADS, MAX_LENGTH, SIZES, Bound, _session


def litert_decode_call(data: bytes, batch: int, position: int):
    """`call() -> seconds` of the file's `decode` at `position`, inputs set once."""
    from ai_edge_litert.interpreter import Interpreter

    from keras_posenc.export.decoder.litert_runner import causal_mask

    interpreter = Interpreter(model_content=data, num_threads=1)
    runner = interpreter.get_signature_runner("decode")
    rng = np.random.default_rng(0)
    feeds = {"tokens": np.zeros((batch, 1), np.int32)}
    feeds["input_pos"] = np.array([position], np.int32)
    feeds["mask"] = causal_mask(np.ones((batch, MAX_LENGTH), np.int32), feeds["input_pos"])
    for name, details in runner.get_input_details().items():
        if name.startswith("kv_cache_"):
            feeds[name] = rng.normal(size=(batch, *details["shape"][1:])).astype(np.float32)
    runner(**feeds)  # resizes, allocates and sets the inputs
    wrapper, subgraph = runner._interpreter_wrapper, runner._subgraph_index

    def call() -> float:
        start = time.perf_counter()
        wrapper.Invoke(subgraph)
        return time.perf_counter() - start

    return call


def _xla(step_model, batch: int, position: int):
    import tensorflow as tf

    cache_shape = (batch, *step_model.inputs[1].shape[1:])
    step = tf.function(lambda feeds: step_model(feeds)["logits"], jit_compile=True)
    feeds = {
        "token_ids": tf.zeros((batch, 1), tf.int32),
        "cache": tf.random.normal(cache_shape),
        "cache_update_index": tf.constant(position, tf.int32),
        "padding_mask": tf.ones((batch, MAX_LENGTH), tf.int32),
    }

    def call() -> float:
        start = time.perf_counter()
        step(feeds).numpy()
        return time.perf_counter() - start

    return call


def run(rounds: int = 40, sizes=tuple(SIZES)) -> list[dict]:
    import keras
    import tensorflow as tf

    from benchmarks.decode_floor import step_model
    from benchmarks.gqa_reference import reference_graph
    from keras_posenc.export.decoder import decoder_litert, describe_decoder

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    rows = []
    for name in sizes:
        keras.utils.set_random_seed(0)
        size = SIZES[name]
        model = step_model(size)
        decoder = describe_decoder(model, MAX_LENGTH)
        data = decoder_litert(decoder)
        gqa = _session(reference_graph(decoder))
        kv_shape = (KV_HEADS, MAX_LENGTH, size["head_dim"])
        for batch in (1, 4):
            for position in (100, 900):
                calls = {
                    "litert": litert_decode_call(data, batch, position),
                    "xla": _xla(model, batch, position),
                    "gqa": Bound(gqa, batch, position, kv_shape),
                }
                for call in calls.values():
                    call(), call()  # warm up (XLA compiles on the first)
                times = {kind: [] for kind in calls}
                order = random.Random(position * 10 + batch)
                for _ in range(rounds):
                    for kind in order.sample(list(calls), len(calls)):
                        times[kind].append(calls[kind]())
                ms = {kind: 1000 * statistics.median(t) for kind, t in times.items()}
                rows.append({"size": name, "batch": batch, "position": position, **ms})
                print(
                    f"| {name} | {batch} | {position} | {ms['litert']:.3f} | {ms['xla']:.3f} | "
                    f"{ms['litert'] / ms['xla']:.2f} | {ms['gqa']:.3f} | "
                    f"{ms['xla'] / ms['gqa']:.2f} |",
                    flush=True,
                )
    return rows


def main(rounds: int = 40) -> list[dict]:
    print(
        "| size | batch | position | LiteRT (ms) | Keras XLA (ms) | LiteRT / XLA | "
        "GQA graph (ms) | XLA / GQA |"
    )
    print("| --- " * 8 + "|")
    return run(rounds)
