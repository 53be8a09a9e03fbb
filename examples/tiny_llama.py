"""A tiny Llama-style decoder: trained, then generating greedily with a KV cache, Keras and ONNX.

The decoder is `keras_posenc.DecoderBlock`s (RMSNormalization, grouped-query attention
with RoPE (llama3 scaling) and a key/value cache, RMSNormalization, SwiGLU MLP) between a
token embedding and a final norm and head, made by `keras_posenc.decoder_models`. It
trains for a few seconds on a made-up task (continue a periodic sequence: the next token
is the one a period back, which takes relative positions).

Keras generates through one decode step under `jit_compile=True`, one token per call,
the prompt included, with a cache of fixed size `(batch, layers, 2, max_length, kv_heads,
head_dim)`: one XLA compilation for the whole generation. `save_decoder` writes the step
as onnxruntime-genai's folder (`model.onnx` with `GroupQueryAttention`,
`genai_config.json`) and a LiteRT file, each verified against Keras before it is kept;
then a child process that imports onnxruntime and numpy only (never TensorFlow) runs the
same greedy loop on `model.onnx` the way onnxruntime-genai does: the left-padded prompt in
one call, then one token per call, one cache buffer per layer bound as past and present.
Where onnxruntime-genai is installed, its `og.Generator` generates each prompt too.

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


# Heads of 16: onnxruntime's GroupQueryAttention rotates head sizes in multiples of 16.
TINY = Size(
    width=32,
    query_heads=2,
    kv_heads=1,
    ffn=64,
    max_length=24,
    train_steps=20,
    train_length=12,
    new_tokens=12,
)
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


def onnx_generation(folder: Path, arrays: Path, out: Path) -> None:
    """Greedy generation through `folder/model.onnx` (onnxruntime-genai's interface)."""
    import onnxruntime

    data = np.load(arrays)
    size = Size(**json.loads(str(data["size"])))
    prompts, mask = data["prompts"].astype(np.int64), data["mask"].astype(np.int64)
    session = onnxruntime.InferenceSession(
        str(folder / "model.onnx"), providers=["CPUExecutionProvider"]
    )
    # One buffer per cache tensor, bound as both past and present: written in place. The
    # buffers are kept here: a binding does not keep its OrtValues alive (onnxruntime 1.23
    # reads freed memory once the loop's variable lets go of all but the last).
    binding = session.io_binding()
    binding.bind_output("logits")  # first: `get_outputs()[0]`
    buffers = {}
    for value in session.get_inputs()[2:]:
        shape = (len(prompts), value.shape[1], size.max_length, value.shape[3])
        buffers[value.name] = onnxruntime.OrtValue.ortvalue_from_numpy(np.zeros(shape, np.float32))
        binding.bind_ortvalue_input(value.name, buffers[value.name])
        present = value.name.replace("past_key_values", "present")
        binding.bind_ortvalue_output(present, buffers[value.name])
    ids, attention, tokens, logits, seconds = prompts, mask, [], [], []
    for _ in range(size.new_tokens):
        binding.bind_cpu_input("input_ids", np.ascontiguousarray(ids))
        binding.bind_cpu_input("attention_mask", np.ascontiguousarray(attention))
        binding.bind_output("logits")
        start = time.perf_counter()
        session.run_with_iobinding(binding)
        seconds.append(time.perf_counter() - start)
        last = binding.get_outputs()[0].numpy()[:, -1]
        logits.append(last)
        tokens.append(np.argmax(last, axis=-1).astype(np.int32))
        ids = tokens[-1][:, None].astype(np.int64)
        attention = np.concatenate([attention, np.ones((len(ids), 1), np.int64)], axis=1)
    loaded = sorted(m for m in ("tensorflow", "keras", "keras_posenc") if m in sys.modules)
    np.savez(
        out,
        tokens=np.stack(tokens, 1),
        logits=np.stack(logits, 1),
        seconds=statistics.median(seconds[1:]),
        loaded=json.dumps(loaded),
    )


def genai_generation(folder: Path, prompts: np.ndarray, mask: np.ndarray, count: int):
    """Each prompt (its real tokens) through onnxruntime-genai's `og.Generator`, or None
    where onnxruntime-genai is not installed."""
    try:
        import onnxruntime_genai as og
    except ImportError:
        return None
    model = og.Model(str(folder))
    rows = []
    for prompt, real in zip(prompts, mask, strict=True):
        tokens = prompt[real.astype(bool)]
        params = og.GeneratorParams(model)
        params.set_search_options(max_length=len(tokens) + count, do_sample=False)
        generator = og.Generator(model, params)
        generator.append_tokens(tokens.astype(np.int32)[None])
        new = []
        while not generator.is_done() and len(new) < count:
            generator.generate_next_token()
            new.append(int(generator.get_next_tokens()[0]))
        rows.append(new)
    return np.array(rows, np.int32)


# --------------------------------------------------------------------------------------
# Keras: TensorFlow, Keras and keras_posenc, imported inside the functions that use them.


def build_decoder(size: Size):
    """`(training model, decode step model)` of one stack of `DecoderBlock`s.

    The training model maps `(batch, sequence)` token ids to logits with a causal mask;
    the step model takes `token_ids`, `cache`, `cache_update_index` and `padding_mask` and
    returns `logits` and `next_cache`.
    """
    os.environ.setdefault("KERAS_BACKEND", "tensorflow")
    import keras

    from keras_posenc import DecoderBlock, decoder_models

    blocks = [
        DecoderBlock(
            size.head_dim,
            size.query_heads,
            size.kv_heads,
            size.ffn,
            rope_max_wavelength=500000.0,
            rope_scaling=LLAMA3,
            name=f"block_{i}",
        )
        for i in range(size.layers)
    ]
    return decoder_models(
        keras.layers.Embedding(size.vocabulary, size.width, name="embed"),
        blocks,
        keras.layers.RMSNormalization(name="final_norm"),
        keras.layers.Dense(size.vocabulary, use_bias=False, name="head"),
        max_length=size.max_length,
        name="tiny_llama",
    )


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

    from keras_posenc.export import save_decoder

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
        report = save_decoder(
            step_model, folder / "decoder", max_length=size.max_length, formats=("onnx", "litert")
        )
        np.savez(
            folder / "arrays.npz",
            prompts=prompts,
            mask=mask,
            size=json.dumps(dataclasses.asdict(size)),
        )
        child = [sys.executable, __file__, "onnx", "--model", str(folder / "decoder")]
        child += ["--arrays", str(folder / "arrays.npz"), "--out", str(folder / "onnx.npz")]
        subprocess.run(child, check=True)
        onnx = dict(np.load(folder / "onnx.npz"))
        genai_tokens = genai_generation(folder / "decoder", prompts, mask, size.new_tokens)

    results = {
        "training_seconds": training_seconds,
        "loss": (first_loss, last_loss),
        "accuracy": accuracy,
        "traces": traces,
        "verified": {
            runtime: all(case["runtimes"][runtime]["passed"] for case in report["cases"])
            for runtime in report["cases"][0]["runtimes"]
        },
        "same_tokens": bool(np.array_equal(tokens, onnx["tokens"])),
        "max_logit_difference": float(np.abs(logits - onnx["logits"]).max()),
        "keras_ms_per_token": 1000 * keras_seconds,
        "onnx_ms_per_token": 1000 * float(onnx["seconds"]),
        "onnx_process_imported": json.loads(str(onnx["loaded"])),
        "genai_same_tokens": None
        if genai_tokens is None
        else bool(np.array_equal(genai_tokens, tokens)),
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
    print(f"  save_decoder's verification (64 steps, batch 1 and 4): {results['verified']}")
    genai = results["genai_same_tokens"]
    print(
        "  onnxruntime-genai: "
        + ("not installed" if genai is None else f"same tokens as Keras: {genai}")
    )
    return results


def periodic_continuation(prompt: np.ndarray, count: int) -> np.ndarray:
    """The `count` tokens that continue `prompt` with its shortest period (2 to 4)."""
    period = next(p for p in (2, 3, 4) if np.array_equal(prompt[p:], prompt[:-p]))
    return np.array([prompt[len(prompt) - period + i % period] for i in range(count)])


if __name__ == "__main__":
    main()
