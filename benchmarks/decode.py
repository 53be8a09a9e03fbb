"""`python -m benchmarks.decode`: one decode step with a KV cache, under XLA, against keras_hub.

A Llama-style decoder (2 blocks, width 256, 8 query / 2 key-value heads of 32, SwiGLU,
RMSNormalization, a cache of 1024 slots) runs one token per step through one
`tf.function(jit_compile=True)`, built three ways:

- `keras_posenc`: `RotaryGroupQueryAttention` with its cache (2 key/value heads cached);
- `keras_hub MHA`: keras_hub's `CachedMultiHeadAttention` with keras_hub's
  `RotaryEmbedding` on the projected queries and new keys (multi-head only: 8 heads cached);
- `keras_hub Llama`: keras_hub's `LlamaAttention` (grouped-query, 2 heads cached).

Reported, per batch size 1 and 8: the first call (tracing and compiling), the second
call, and the median over 64 steps of a generation (positions 1..64), interleaved in a
random order per round; the step at position 1000 against recomputing all 1001 tokens
without a cache; and the exported step in onnxruntime against TensorFlow's.

    python -m benchmarks.decode             # about 2 minutes on 2 idle cores
    python -m benchmarks.decode --steps 8   # a quick look
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
from pathlib import Path  # noqa: E402

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from keras_posenc import RotaryGroupQueryAttention  # noqa: E402

VOCABULARY, WIDTH, LAYERS, QUERY_HEADS, KV_HEADS, HEAD_DIM = 512, 256, 2, 8, 2, 32
FFN, MAX_LENGTH, BASE = 512, 1024, 500000.0


class HubRotaryCachedAttention(keras.layers.Layer):
    """keras_hub's `CachedMultiHeadAttention` with keras_hub's `RotaryEmbedding` on q and k.

    keras_hub's own decoders (GPT-NeoX, Gemma) rotate this way: project, rotate the query
    and the new key at `cache_update_index`, write the cache, attend.
    """

    def __init__(self, **kwargs):
        import keras_hub

        super().__init__(**kwargs)
        self.attention = keras_hub.layers.CachedMultiHeadAttention(QUERY_HEADS, HEAD_DIM)
        self.rope = keras_hub.layers.RotaryEmbedding(max_wavelength=BASE)

    def build(self, shape):
        self.attention.build(shape, shape)

    def call(self, x, attention_mask=None, cache=None, cache_update_index=None):
        attention = self.attention
        query = self.rope(attention._query_dense(x), start_index=cache_update_index)
        key = self.rope(attention._key_dense(x), start_index=cache_update_index)
        value = attention._value_dense(x)
        start = [0, cache_update_index, 0, 0]
        key = keras.ops.slice_update(cache[:, 0], start, key)
        value = keras.ops.slice_update(cache[:, 1], start, value)
        output, _ = attention._compute_attention(query, key, value, attention_mask=attention_mask)
        return attention._output_dense(output), keras.ops.stack((key, value), axis=1)


def decoder(kind: str):
    """`(step(ids, cache, index) -> (logits, cache), full(ids) -> logits, cache heads)`."""
    from keras_hub.src.models.llama.llama_attention import LlamaAttention

    layers = keras.layers
    embed = layers.Embedding(VOCABULARY, WIDTH)
    blocks = []
    for _ in range(LAYERS):
        if kind == "keras_posenc":
            attention = RotaryGroupQueryAttention(
                HEAD_DIM, QUERY_HEADS, KV_HEADS, rope_max_wavelength=BASE, use_bias=False
            )
        elif kind == "keras_hub MHA":
            attention = HubRotaryCachedAttention()
        else:
            attention = LlamaAttention(QUERY_HEADS, KV_HEADS, rope_max_wavelength=BASE)
        blocks.append(
            (
                layers.RMSNormalization(),
                attention,
                layers.RMSNormalization(),
                layers.Dense(FFN, use_bias=False),
                layers.Dense(FFN, use_bias=False),
                layers.Dense(WIDTH, use_bias=False),
            )
        )
    norm, head = layers.RMSNormalization(), layers.Dense(VOCABULARY, use_bias=False)
    cache_heads = QUERY_HEADS if kind == "keras_hub MHA" else KV_HEADS

    def attend(attention, h, cache, index):
        if kind == "keras_posenc":
            if cache is None:
                return attention(h, h, use_causal_mask=True), None
            return attention(h, h, use_causal_mask=True, cache=cache, cache_update_index=index)
        from keras_hub.src.layers.modeling.transformer_layer_utils import compute_causal_mask

        batch, steps = tf.shape(h)[0], tf.shape(h)[1]
        length = steps if cache is None else MAX_LENGTH
        mask = compute_causal_mask(batch, length, steps, 0 if index is None else index)
        if kind == "keras_hub MHA":
            return attention(h, attention_mask=mask, cache=cache, cache_update_index=index)
        return attention(h, attention_mask=mask, cache=cache, cache_update_index=index)

    def forward(ids, cache=None, index=None):
        x = embed(ids)
        caches = []
        for i, (norm_1, attention, norm_2, gate, up, down) in enumerate(blocks):
            h = norm_1(x)
            attended, layer_cache = attend(
                attention, h, None if cache is None else cache[:, i], index
            )
            caches.append(layer_cache)
            x = x + attended
            h = norm_2(x)
            x = x + down(keras.ops.silu(gate(h)) * up(h))
        logits = head(norm(x))
        return logits if cache is None else (logits, keras.ops.stack(caches, axis=1))

    cache_shape = (LAYERS, 2, MAX_LENGTH, cache_heads, HEAD_DIM)
    return forward, cache_shape


def compiled_step(forward, batch: int, cache_shape):
    return tf.function(
        lambda ids, cache, index: forward(ids, cache, index),
        jit_compile=True,
        input_signature=[
            tf.TensorSpec((batch, 1), tf.int32),
            tf.TensorSpec((batch, *cache_shape), tf.float32),
            tf.TensorSpec((), tf.int32),
        ],
    )


def timed(call) -> float:
    start = time.perf_counter()
    logits, _ = call()
    logits._numpy()
    return time.perf_counter() - start


def generation(steps: int, batch: int, seed: int = 0) -> dict:
    """Each decoder's first, second and median step over `steps`, interleaved per round."""
    keras.utils.set_random_seed(seed)
    candidates = {}
    for kind in ("keras_posenc", "keras_hub MHA", "keras_hub Llama"):
        forward, cache_shape = decoder(kind)
        forward(tf.zeros((batch, 1), tf.int32), tf.zeros((batch, *cache_shape)), 0)  # build
        step = compiled_step(forward, batch, cache_shape)
        cache = tf.zeros((batch, *cache_shape))
        ids = tf.zeros((batch, 1), tf.int32)
        candidates[kind] = {"step": step, "cache": cache, "ids": ids, "times": []}
    rng = random.Random(seed)
    for position in range(steps + 1):
        order = list(candidates)
        rng.shuffle(order)
        for kind in order:
            state = candidates[kind]
            index = tf.constant(position)

            def call(state=state, index=index):
                logits, state["cache"] = state["step"](state["ids"], state["cache"], index)
                return logits, state["cache"]

            state["times"].append(timed(call))
    results = {}
    for kind, state in candidates.items():
        times = state["times"]
        results[kind] = {
            "first_s": times[0],
            "second_ms": 1000 * times[1],
            "median_ms": 1000 * statistics.median(times[1:]),
            "traces": state["step"].experimental_get_tracing_count(),
        }
    return results


def cached_against_full(batch: int, repeats: int, position: int = 1000) -> dict:
    """The cached step at `position` against the whole `position + 1` tokens without a cache."""
    keras.utils.set_random_seed(0)
    forward, cache_shape = decoder("keras_posenc")
    ids = tf.zeros((batch, position + 1), tf.int32)
    forward(ids[:, :1], tf.zeros((batch, *cache_shape)), 0)
    step = compiled_step(forward, batch, cache_shape)
    full = tf.function(lambda ids: (forward(ids), None), jit_compile=True)
    cache = tf.random.normal((batch, *cache_shape))
    index = tf.constant(position)
    calls = {
        "cached": lambda: step(ids[:, :1], cache, index),
        "full": lambda: full(ids),
    }
    times = {name: [] for name in calls}
    for call in calls.values():
        timed(call)  # compile
    for _ in range(repeats):
        for name in random.sample(list(calls), len(calls)):
            times[name].append(timed(calls[name]))
    return {name: 1000 * statistics.median(t) for name, t in times.items()}


def onnx_against_tensorflow(batch: int, steps: int) -> dict:
    """The exported step (functional model, onnxruntime) against the same step under XLA."""
    import onnxruntime

    from keras_posenc.export import save_onnx

    keras.utils.set_random_seed(0)
    forward, cache_shape = decoder("keras_posenc")
    ids = keras.Input((None,), dtype="int32", name="token_ids")
    cache = keras.Input(cache_shape, name="cache")
    index = keras.Input(batch_shape=(), dtype="int32", name="cache_update_index")
    logits, next_cache = forward(ids, cache, index)
    model = keras.Model(
        [ids, cache, index],
        {
            "logits": keras.layers.Identity(name="logits")(logits),
            "next_cache": keras.layers.Identity(name="next_cache")(next_cache),
        },
    )
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "step.onnx"
        save_onnx(model, path)
        session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    step = compiled_step(forward, batch, cache_shape)
    state = {"tf": tf.zeros((batch, *cache_shape)), "ort": np.zeros((batch, *cache_shape), "f4")}
    token = np.zeros((batch, 1), np.int32)
    times = {"tensorflow": [], "onnxruntime": []}
    for position in range(steps + 1):
        start = time.perf_counter()
        logits, state["tf"] = step(token, state["tf"], tf.constant(position))
        logits._numpy()
        times["tensorflow"].append(time.perf_counter() - start)
        feeds = {"token_ids": token, "cache": state["ort"]}
        feeds["cache_update_index"] = np.array(position, np.int32)
        start = time.perf_counter()
        _, state["ort"] = session.run(["logits", "next_cache"], feeds)
        times["onnxruntime"].append(time.perf_counter() - start)
    return {name: 1000 * statistics.median(t[1:]) for name, t in times.items()}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=64, help="decode steps timed (64)")
    parser.add_argument(
        "--part",
        choices=("all", "floor", "litert", "quantized", "xla"),
        default="all",
        help="floor: the exported step (GQA and standard-op graphs) against the genai-style "
        "GQA graph (decode_floor.py); litert: the LiteRT step against the Keras XLA step, and "
        "that against the GQA graph (decode_litert.py); quantized: int4 / int8 files against "
        "the onnxruntime-genai builder's through og.Generator (quantized_decode.py, not in "
        "all); xla: the Keras XLA step against keras_hub",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=None,
        help="interleaved rounds (floor, litert: 40; quantized: 15)",
    )
    parser.add_argument("--quick", action="store_true", help="quantized: one size, batch 1, ~100")
    args = parser.parse_args(argv)
    if args.part == "quantized":
        from benchmarks import quantized_decode

        options = ["--rounds", str(args.rounds or 15)] + ["--quick"] * args.quick
        return {"quantized": quantized_decode.main(options)}
    args.rounds = args.rounds or 40
    results = {}
    if args.part in ("all", "floor"):
        from benchmarks import decode_floor

        print("\nonnxruntime, ms per step (median), one thread, shared cache buffers:")
        results["floor"] = decode_floor.main(args.rounds)
        if args.part == "floor":
            return results
    if args.part in ("all", "litert"):
        from benchmarks import decode_litert

        print("\nLiteRT, Keras XLA and the GQA graph, ms per step (median), one thread:")
        results["litert"] = decode_litert.main(args.rounds)
        if args.part == "litert":
            return results
    for batch in (1, 8):
        results[f"generation_{batch}"] = generation(args.steps, batch)
        print(
            f"\nbatch {batch}: {args.steps} steps of a generation, "
            "ms per step (one new token per row)"
        )
        print(
            f"  {'decoder':<16} {'first (s)':>9} {'second':>8} {'median':>8} {'2nd/med':>7} traces"
        )
        for kind, r in results[f"generation_{batch}"].items():
            print(
                f"  {kind:<16} {r['first_s']:>9.2f} {r['second_ms']:>8.2f} {r['median_ms']:>8.2f} "
                f"{r['second_ms'] / r['median_ms']:>7.2f} {r['traces']:>6}"
            )
        ours = results[f"generation_{batch}"]["keras_posenc"]["median_ms"]
        for kind in ("keras_hub MHA", "keras_hub Llama"):
            theirs = results[f"generation_{batch}"][kind]["median_ms"]
            print(f"  keras_posenc / {kind}: {ours / theirs:.2f}")
    for batch in (1, 8):
        r = results[f"position_1000_{batch}"] = cached_against_full(batch, max(3, args.steps // 8))
        print(
            f"\nbatch {batch}, position 1000: cached step {r['cached']:.2f} ms, all 1001 tokens "
            f"without a cache {r['full']:.1f} ms: {r['full'] / r['cached']:.0f}x"
        )
    for batch in (1, 8):
        r = results[f"onnx_{batch}"] = onnx_against_tensorflow(batch, args.steps)
        print(
            f"\nbatch {batch}, exported step: onnxruntime {r['onnxruntime']:.2f} ms, TensorFlow "
            f"(XLA) {r['tensorflow']:.2f} ms: {r['onnxruntime'] / r['tensorflow']:.2f}x"
        )
    return results


if __name__ == "__main__":
    main()
