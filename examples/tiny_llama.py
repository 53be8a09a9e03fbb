"""A tiny Llama-style decoder: trained, then generating greedily with a KV cache in Keras and ONNX.

The decoder is made of Keras layers and the package's `RotaryGroupQueryAttention`:
token embedding, then per block RMSNormalization, grouped-query attention with RoPE
(llama3 scaling) and a key/value cache, RMSNormalization and a SwiGLU MLP, then a final
norm and the logits. It trains for a few seconds on a made-up task (continue a periodic
sequence: the next token is the one a period back, which takes relative positions).

Generation feeds one token per call to one decode step, the prompt included, with a cache
of fixed size `(batch, layers, 2, max_length, kv_heads, head_dim)`: under
`jit_compile=True` that is one XLA compilation for the whole generation. The step is
exported to ONNX, and a child process that imports onnxruntime and numpy only (never
TensorFlow) runs the same greedy loop, feeding the cache back. The prompts are a
left-padded batch; positions come from the padding mask, so each row generates as it
would alone.

Run it:

    python examples/tiny_llama.py           # a few seconds of training, 48 new tokens
    python examples/tiny_llama.py --tiny    # smaller and shorter (also KERAS_POSENC_EXAMPLE_TINY=1)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

TINY_ENVIRONMENT_VARIABLE = "KERAS_POSENC_EXAMPLE_TINY"
PAD = 0  # token id of the left padding


@dataclasses.dataclass(frozen=True)
class Size:
    vocabulary: int = 24
    width: int = 64
    layers: int = 2
    query_heads: int = 4
    kv_heads: int = 2
    ffn: int = 128
    max_length: int = 64
    train_steps: int = 300
    train_length: int = 24
    prompt_length: int = 10
    new_tokens: int = 48

    @property
    def head_dim(self) -> int:
        return self.width // self.query_heads


TINY = Size(width=32, ffn=64, max_length=24, train_steps=20, train_length=12, new_tokens=12)
FULL = Size()
LLAMA3 = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 32,
}


def periodic_sequences(rng, count: int, length: int, vocabulary: int) -> np.ndarray:
    """Rows that repeat a random pattern of 2 to 4 tokens (ids 1.., 0 is the padding)."""
    rows = np.empty((count, length), np.int32)
    for row in rows:
        period = rng.integers(2, 5)
        pattern = rng.integers(1, vocabulary, period)
        row[:] = np.resize(pattern, length)
    return rows


def left_padded_prompts(rng, size: Size, batch: int = 4) -> tuple[np.ndarray, np.ndarray]:
    """`(token_ids, mask)` `(batch, prompt_length)`: prompts of different lengths, padded left."""
    prompts = periodic_sequences(rng, batch, size.prompt_length, size.vocabulary)
    mask = np.ones_like(prompts)
    for row, pad in enumerate(rng.integers(0, 4, batch)):
        prompts[row] = np.roll(prompts[row], pad)
        prompts[row, :pad], mask[row, :pad] = PAD, 0
    return prompts, mask


def greedy(step, prompts: np.ndarray, mask: np.ndarray, size: Size, cache: np.ndarray):
    """Feed the prompt, then each argmax, one token per `step` call; also times the calls.

    `step(token_ids (batch, 1), cache, cache_update_index, padding_mask)` returns
    `(logits (batch, 1, vocabulary), cache)`. Returns `(new tokens, their logits, seconds
    per call after the first)`.
    """
    batch = prompts.shape[0]
    padding = np.ones((batch, size.max_length), np.int32)
    padding[:, : prompts.shape[1]] = mask
    tokens, logits, seconds = [], [], []
    last = None
    for index in range(prompts.shape[1] + size.new_tokens - 1):
        if index < prompts.shape[1]:
            ids = prompts[:, index : index + 1]
        else:
            ids = tokens[-1][:, None]
        start = time.perf_counter()
        last, cache = step(ids.astype(np.int32), cache, np.array(index, np.int32), padding)
        seconds.append(time.perf_counter() - start)
        if index >= prompts.shape[1] - 1:
            logits.append(last[:, -1])
            tokens.append(np.argmax(last[:, -1], axis=-1).astype(np.int32))
    return np.stack(tokens, 1), np.stack(logits, 1), statistics.median(seconds[1:])


# --------------------------------------------------------------------------------------
# onnxruntime and numpy only: the child process.


def onnx_generation(model_path: Path, arrays: Path, out: Path) -> None:
    import onnxruntime

    data = np.load(arrays)
    size = Size(**json.loads(str(data["size"])))
    session = onnxruntime.InferenceSession(str(model_path), providers=["CPUExecutionProvider"])

    def step(ids, cache, index, padding):
        feeds = {"token_ids": ids, "cache": cache, "cache_update_index": index}
        feeds["padding_mask"] = padding
        return session.run(["logits", "next_cache"], feeds)

    cache = np.zeros(data["cache_shape"], np.float32)
    tokens, logits, seconds = greedy(step, data["prompts"], data["mask"], size, cache)
    loaded = sorted(m for m in ("tensorflow", "keras", "keras_posenc") if m in sys.modules)
    np.savez(out, tokens=tokens, logits=logits, seconds=seconds, loaded=json.dumps(loaded))


# --------------------------------------------------------------------------------------
# Keras: TensorFlow, Keras and keras_posenc, imported inside the functions that use them.


def build_decoder(size: Size):
    """`(training model, decode step model)`, sharing their layers.

    The training model maps `(batch, sequence)` token ids to logits with a causal mask;
    the step model takes `token_ids`, `cache`, `cache_update_index` and `padding_mask` and
    returns `logits` and `next_cache`.
    """
    os.environ.setdefault("KERAS_BACKEND", "tensorflow")
    import keras

    from keras_posenc import RotaryGroupQueryAttention

    layers = keras.layers
    embed = layers.Embedding(size.vocabulary, size.width, name="embed")
    blocks = []
    for i in range(size.layers):
        blocks.append(
            {
                "attention_norm": layers.RMSNormalization(name=f"attention_norm_{i}"),
                "attention": RotaryGroupQueryAttention(
                    size.head_dim,
                    size.query_heads,
                    size.kv_heads,
                    rope_max_wavelength=500000.0,
                    rope_scaling=LLAMA3,
                    positions_from_mask=True,
                    use_bias=False,
                    name=f"attention_{i}",
                ),
                "mlp_norm": layers.RMSNormalization(name=f"mlp_norm_{i}"),
                "gate": layers.Dense(size.ffn, use_bias=False, name=f"gate_{i}"),
                "up": layers.Dense(size.ffn, use_bias=False, name=f"up_{i}"),
                "down": layers.Dense(size.width, use_bias=False, name=f"down_{i}"),
            }
        )
    final_norm = layers.RMSNormalization(name="final_norm")
    head = layers.Dense(size.vocabulary, use_bias=False, name="head")

    def forward(ids, cache=None, index=None, padding=None):
        x = embed(ids)
        caches = []
        for i, block in enumerate(blocks):
            h = block["attention_norm"](x)
            if cache is None:
                attended = block["attention"](h, h, use_causal_mask=True)
            else:
                attended, layer_cache = block["attention"](
                    h,
                    h,
                    use_causal_mask=True,
                    cache=cache[:, i],
                    cache_update_index=index,
                    cache_mask=padding,
                )
                caches.append(layer_cache)
            x = x + attended
            h = block["mlp_norm"](x)
            x = x + block["down"](keras.ops.silu(block["gate"](h)) * block["up"](h))
        return head(final_norm(x)), caches

    # The cached call first: Keras checks a functional model's connections with the
    # outputs of each layer's first call, and the cached call has one more (the cache).
    ids = keras.Input((None,), dtype="int32", name="token_ids")
    cache = keras.Input(
        (size.layers, 2, size.max_length, size.kv_heads, size.head_dim), name="cache"
    )
    index = keras.Input(batch_shape=(), dtype="int32", name="cache_update_index")
    padding = keras.Input((size.max_length,), dtype="int32", name="padding_mask")
    logits, caches = forward(ids, cache, index, padding)
    outputs = {
        "logits": layers.Identity(name="logits")(logits),
        "next_cache": layers.Identity(name="next_cache")(keras.ops.stack(caches, axis=1)),
    }
    step_model = keras.Model([ids, cache, index, padding], outputs, name="tiny_llama_step")
    train_model = keras.Model(ids, forward(ids)[0], name="tiny_llama")
    return train_model, step_model


def train(train_model, size: Size, seed: int = 0) -> tuple[float, float]:
    """Next-token training on periodic sequences; returns the held-out loss before and after."""
    import keras

    rng = np.random.default_rng(seed)
    rows = periodic_sequences(rng, 64 * size.train_steps, size.train_length + 1, size.vocabulary)
    train_model.compile(
        optimizer=keras.optimizers.Adam(3e-3),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    held_out = periodic_sequences(rng, 256, size.train_length + 1, size.vocabulary)

    def loss() -> float:
        return float(train_model.evaluate(held_out[:, :-1], held_out[:, 1:], verbose=0))

    before = loss()
    train_model.fit(rows[:, :-1], rows[:, 1:], batch_size=64, epochs=1, verbose=0)
    return before, loss()


def keras_generation(step_model, prompts, mask, size: Size):
    """Greedy generation through one `tf.function(jit_compile=True)` step."""
    import tensorflow as tf

    cache_shape = (prompts.shape[0], *step_model.inputs[1].shape[1:])
    step_function = tf.function(
        lambda ids, cache, index, padding: step_model(
            {"token_ids": ids, "cache": cache, "cache_update_index": index, "padding_mask": padding}
        ),
        jit_compile=True,
        input_signature=[
            tf.TensorSpec((prompts.shape[0], 1), tf.int32),
            tf.TensorSpec(cache_shape, tf.float32),
            tf.TensorSpec((), tf.int32),
            tf.TensorSpec((prompts.shape[0], size.max_length), tf.int32),
        ],
    )

    def step(ids, cache, index, padding):
        outputs = step_function(ids, cache, index, padding)
        return outputs["logits"].numpy(), outputs["next_cache"]

    tokens, logits, seconds = greedy(step, prompts, mask, size, tf.zeros(cache_shape))
    return tokens, logits, seconds, step_function.experimental_get_tracing_count()


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", nargs="?", choices=("onnx",), help=argparse.SUPPRESS)
    parser.add_argument("--model", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--arrays", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    parser.add_argument(
        "--tiny",
        action="store_true",
        default=os.environ.get(TINY_ENVIRONMENT_VARIABLE, "") not in ("", "0"),
        help=f"a smaller decoder, trained briefly (also {TINY_ENVIRONMENT_VARIABLE}=1)",
    )
    args = parser.parse_args(argv)
    if args.command == "onnx":
        onnx_generation(args.model, args.arrays, args.out)
        return {}

    os.environ.setdefault("KERAS_BACKEND", "tensorflow")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras

    from keras_posenc.export import save_onnx

    size = TINY if args.tiny else FULL
    keras.utils.set_random_seed(0)
    train_model, step_model = build_decoder(size)
    start = time.perf_counter()
    first_loss, last_loss = train(train_model, size)
    training_seconds = time.perf_counter() - start

    prompts, mask = left_padded_prompts(np.random.default_rng(1), size)
    tokens, logits, keras_seconds, traces = keras_generation(step_model, prompts, mask, size)
    expected = [
        periodic_continuation(p[m.astype(bool)], size.new_tokens)
        for p, m in zip(prompts, mask, strict=True)
    ]
    accuracy = float(np.mean(tokens == np.stack(expected)))

    with tempfile.TemporaryDirectory() as folder:
        folder = Path(folder)
        save_onnx(step_model, folder / "step.onnx")
        np.savez(
            folder / "arrays.npz",
            prompts=prompts,
            mask=mask,
            cache_shape=np.array((prompts.shape[0], *step_model.inputs[1].shape[1:])),
            size=json.dumps(dataclasses.asdict(size)),
        )
        child = [sys.executable, __file__, "onnx", "--model", str(folder / "step.onnx")]
        child += ["--arrays", str(folder / "arrays.npz"), "--out", str(folder / "onnx.npz")]
        subprocess.run(child, check=True)
        onnx = dict(np.load(folder / "onnx.npz"))

    results = {
        "training_seconds": training_seconds,
        "loss": (first_loss, last_loss),
        "accuracy": accuracy,
        "traces": traces,
        "same_tokens": bool(np.array_equal(tokens, onnx["tokens"])),
        "max_logit_difference": float(np.abs(logits - onnx["logits"]).max()),
        "keras_ms_per_token": 1000 * keras_seconds,
        "onnx_ms_per_token": 1000 * float(onnx["seconds"]),
        "onnx_process_imported": json.loads(str(onnx["loaded"])),
    }
    print(f"trained {training_seconds:.1f} s: loss {first_loss:.3f} -> {last_loss:.3f}")
    print(f"greedy continuation of {len(prompts)} left-padded prompts, {size.new_tokens} tokens:")
    print(f"  right (the token a period back): {accuracy:.0%}")
    print(f"  Keras, one XLA step ({traces} trace): {results['keras_ms_per_token']:.2f} ms/token")
    print(f"  onnxruntime alone:              {results['onnx_ms_per_token']:.2f} ms/token")
    print(
        f"  same tokens: {results['same_tokens']}, max |logits difference| "
        f"{results['max_logit_difference']:.1e}; onnxruntime's process imported "
        f"{results['onnx_process_imported'] or 'no TensorFlow/Keras'}"
    )
    return results


def periodic_continuation(prompt: np.ndarray, count: int) -> np.ndarray:
    """The `count` tokens that continue `prompt` with its shortest period (2 to 4)."""
    period = next(p for p in (2, 3, 4) if np.array_equal(prompt[p:], prompt[:-p]))
    return np.array([prompt[len(prompt) - period + i % period] for i in range(count)])


if __name__ == "__main__":
    main()
