"""A decode step on JAX: `DecoderBlock`s against keras_hub's Llama, both under `jax.jit`.

The same sizes as `benchmarks/keras_hub_decode.py` (width 256, 4 layers, 8 query / 2
key-value heads of 32, MLP 768, vocabulary 1024, cache 1024), random weights; batch 1
and 4, one token per row at positions ~100 and ~900. Candidates, each one `jax.jit`-ed
function of `(weights, token ids, cache, index)` (weights passed in, as keras_hub's
`generate()` compiles its step on JAX, through `keras.StatelessScope`), returning the
logits and the updated cache, which is fed back:

- `keras_posenc`: the decode-step model of `keras_posenc.decoder_models` (a `padding_mask`
  of ones: no padding);
- `keras_hub`: `LlamaCausalLM.call_with_cache`.

Interleaved in a random order per round in one process; median ms per step and the ratio.
`python -m benchmarks.jax_decode [--rounds 30]` (KERAS_BACKEND is set to jax here).
"""

from __future__ import annotations

import os

os.environ["KERAS_BACKEND"] = "jax"

import argparse  # noqa: E402
import itertools  # noqa: E402
import random  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402
import keras  # noqa: E402
import numpy as np  # noqa: E402

import keras_posenc as kp  # noqa: E402

VOCABULARY, MAX_LENGTH, WIDTH, LAYERS = 1024, 1024, 256, 4
QUERY_HEADS, KV_HEADS, HEAD_DIM, INTERMEDIATE = 8, 2, 32, 768
BATCHES, POSITIONS = (1, 4), (100, 900)
REPEATS = 5  # back-to-back steps per round (the round's time is their median)


def ours() -> keras.Model:
    blocks = [
        kp.DecoderBlock(HEAD_DIM, QUERY_HEADS, KV_HEADS, INTERMEDIATE, name=f"block_{i}")
        for i in range(LAYERS)
    ]
    _, step = kp.decoder_models(
        keras.layers.Embedding(VOCABULARY, WIDTH),
        blocks,
        keras.layers.RMSNormalization(),
        keras.layers.Dense(VOCABULARY, use_bias=False),
        max_length=MAX_LENGTH,
    )
    return step


def keras_hub_llama():
    import keras_hub

    backbone = keras_hub.models.LlamaBackbone(
        vocabulary_size=VOCABULARY,
        num_layers=LAYERS,
        num_query_heads=QUERY_HEADS,
        num_key_value_heads=KV_HEADS,
        hidden_dim=WIDTH,
        intermediate_dim=INTERMEDIATE,
    )
    return keras_hub.models.LlamaCausalLM(backbone=backbone, preprocessor=None)


def stateless(model, call):
    """`jax.jit` of `call(ids, cache, index)` with `model`'s weights as an argument."""

    def run(state, ids, cache, index):
        trainable, non_trainable = state
        mapping = itertools.chain(
            zip(model.trainable_variables, trainable, strict=True),
            zip(model.non_trainable_variables, non_trainable, strict=True),
        )
        with keras.StatelessScope(state_mapping=mapping):
            return call(ids, cache, index)

    state = (
        [v.value for v in model.trainable_variables],
        [v.value for v in model.non_trainable_variables],
    )
    return jax.jit(run), state


class Step:
    """One candidate at one batch and position: a compiled step whose cache is fed back."""

    def __init__(self, function, state, batch: int, position: int):
        rng = np.random.default_rng(position + batch)
        shape = (batch, LAYERS, 2, MAX_LENGTH, KV_HEADS, HEAD_DIM)
        self.function, self.state = function, state
        self.ids = jax.numpy.asarray(rng.integers(0, VOCABULARY, (batch, 1)).astype("int32"))
        self.cache = jax.numpy.asarray(rng.normal(size=shape).astype("float32"))
        self.index = jax.numpy.asarray(np.int32(position))

    def __call__(self) -> float:
        begin = time.perf_counter()
        logits, self.cache = self.function(self.state, self.ids, self.cache, self.index)
        logits.block_until_ready()
        return time.perf_counter() - begin


def candidates(batch: int, position: int) -> dict:
    step = ours()
    padding = jax.numpy.ones((batch, MAX_LENGTH), "int32")

    def ours_call(ids, cache, index):
        out = step(
            {"token_ids": ids, "cache": cache, "cache_update_index": index, "padding_mask": padding}
        )
        return out["logits"], out["next_cache"]

    hub = keras_hub_llama()

    def hub_call(ids, cache, index):
        logits, _, cache = hub.call_with_cache(ids, cache, index)
        return logits, cache

    return {
        "keras_posenc": Step(*stateless(step, ours_call), batch, position),
        "keras_hub": Step(*stateless(hub, hub_call), batch, position),
    }


def main(rounds: int) -> None:
    device = jax.devices()[0]
    print(
        f"# Decode step under jax.jit ({device.platform}: {device.device_kind}), jax "
        f"{jax.__version__}, Keras {keras.__version__}\n\n"
        f"`python -m benchmarks.jax_decode --rounds {rounds}`: median ms per step.\n\n"
        "| batch | position | keras_posenc | keras_hub | keras_posenc / keras_hub |\n"
        "|--:|--:|--:|--:|--:|"
    )
    for batch, position in itertools.product(BATCHES, POSITIONS):
        calls = candidates(batch, position)
        for call in calls.values():
            for _ in range(3):
                call()  # compile, then warm up
        times = {name: [] for name in calls}
        order = list(calls)
        for _ in range(rounds):
            random.shuffle(order)
            for name in order:
                times[name].append(statistics.median(calls[name]() for _ in range(REPEATS)))
        ms = {name: 1e3 * statistics.median(t) for name, t in times.items()}
        print(
            f"| {batch} | {position} | {ms['keras_posenc']:.3f} | {ms['keras_hub']:.3f} | "
            f"{ms['keras_posenc'] / ms['keras_hub']:.2f} |",
            flush=True,
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m benchmarks.jax_decode", description=__doc__)
    parser.add_argument("--rounds", type=int, default=30)
    main(parser.parse_args().rounds)
