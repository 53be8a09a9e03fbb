"""A tiny Llama-style decoder for the distribution and train-on-JAX tests.

`keras_posenc.decoder_models` of an Embedding, two `DecoderBlock`s (grouped-query RoPE
attention, SwiGLU), an RMSNormalization and a Dense head: the training model (token ids
to next-token logits, causal) and the decode-step model `save_decoder` exports. Sizes let
a 4-way `model` mesh axis split every head and hidden axis evenly.

The task: each sequence counts up by a step drawn per row (`t[i+1] = t[i] + step mod
VOCABULARY`), so the next token depends on the tokens before it.
"""

from __future__ import annotations

import keras
import numpy as np

import keras_posenc as kp

VOCABULARY = 32
WIDTH = 32
HEADS = 8
KV_HEADS = 4
HEAD_DIM = 16  # onnxruntime's GroupQueryAttention takes multiples of 16
INTERMEDIATE = 64
LAYERS = 2
LENGTH = 16  # training sequences
MAX_LENGTH = 96  # the decode step's cache: save_decoder's 64 greedy steps after a prompt


def build() -> tuple[keras.Model, keras.Model]:
    """`(training model, decode-step model)`, sharing their weights."""
    blocks = [
        kp.DecoderBlock(
            HEAD_DIM,
            HEADS,
            KV_HEADS,
            INTERMEDIATE,
            rope_max_wavelength=10000.0,
            name=f"block_{i}",
        )
        for i in range(LAYERS)
    ]
    return kp.decoder_models(
        keras.layers.Embedding(VOCABULARY, WIDTH, name="tokens_embedding"),
        blocks,
        keras.layers.RMSNormalization(name="final_norm"),
        keras.layers.Dense(VOCABULARY, use_bias=False, name="head"),
        max_length=MAX_LENGTH,
        name="tiny_decoder",
    )


def data(samples: int = 64, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Token runs counting up by a per-row step, and the same runs shifted by one."""
    rng = np.random.default_rng(seed)
    first = rng.integers(0, VOCABULARY, (samples, 1))
    step = rng.integers(1, 4, (samples, 1))
    runs = (first + step * np.arange(LENGTH + 1)) % VOCABULARY
    return runs[:, :-1].astype("int32"), runs[:, 1:].astype("int32")


def compile_for_training(model: keras.Model) -> None:
    """SGD, as the encoder's (`tiny_encoder.compile_for_training` says why)."""
    model.compile(
        keras.optimizers.SGD(0.5),
        keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )


def step_inputs(tokens: np.ndarray, cache: np.ndarray, index: int, padding: np.ndarray) -> dict:
    """The decode-step model's inputs."""
    return {
        "token_ids": tokens.astype("int32"),
        "cache": cache,
        "cache_update_index": np.int32(index),
        "padding_mask": padding.astype("int32"),
    }


def empty_cache(batch: int) -> np.ndarray:
    return np.zeros((batch, LAYERS, 2, MAX_LENGTH, KV_HEADS, HEAD_DIM), "float32")


PROMPT = np.array([[3, 4, 5, 6, 7, 8], [0, 0, 9, 11, 13, 15]], "int32")
PROMPT_PADDING = 2  # row 1 is left-padded by this many tokens
DECODE_STEPS = 3


def greedy_probe(call, tokens_after=None) -> dict:
    """The prompt's prefill and `DECODE_STEPS` one-token steps of `call` (the step model, or
    a compiled form of it), batch 2 with row 1 left-padded: `{"logits_i", "tokens_i"}`.

    The next tokens are the argmax of each step's last logits, or `tokens_after["tokens_i"]`
    where given (another backend's choice, so both compute the same steps)."""
    padding = np.ones((len(PROMPT), MAX_LENGTH), "int32")
    padding[1, :PROMPT_PADDING] = 0
    tokens, cache, index, outputs = PROMPT, empty_cache(len(PROMPT)), 0, {}
    for i in range(DECODE_STEPS + 1):
        out = call(step_inputs(tokens, cache, index, padding))
        logits, cache = (keras.ops.convert_to_numpy(out[name]) for name in ("logits", "next_cache"))
        outputs[f"logits_{i}"] = logits
        index += tokens.shape[1]
        tokens = np.argmax(logits[:, -1:], -1).astype("int32")
        if tokens_after is not None:
            tokens = tokens_after[f"tokens_{i + 1}"]
        outputs[f"tokens_{i + 1}"] = tokens
    return outputs
