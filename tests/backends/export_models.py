"""The models `save_decoder` exports on every backend, with the same weights on each.

A `tiny_decoder` decode-step model (the package's DecoderBlocks) and a tiny keras_hub
Llama CausalLM (`keras_hub_models.tiny_causal_lm`), their weights drawn from a seeded
numpy generator (Keras's initialisers draw other numbers on each backend), so the folder
exported under JAX or PyTorch can be compared with the TensorFlow export of the same
weights.
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import numpy as np
import tiny_decoder

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: keras_hub_models

MAX_LENGTH = tiny_decoder.MAX_LENGTH  # the step model's cache: the verification's 72 positions
LLAMA_MAX_LENGTH = 80


@functools.cache  # one model a process: building one on JAX takes seconds
def step_model(seed: int = 0):
    """`tiny_decoder`'s decode-step model, kernels N(0, 1/fan_in), norm scales near 1."""
    _, step = tiny_decoder.build()
    rng = np.random.default_rng(seed)
    for weight in step.weights:
        shape = tuple(weight.shape)
        if weight.path.endswith("scale"):
            value = 1 + 0.2 * rng.standard_normal(shape)
        elif weight.path.endswith("embeddings"):
            value = rng.standard_normal(shape)
        else:  # (in, out), (width, heads, head_dim) or the output's (heads, head_dim, width)
            fan_in = shape[0] * shape[1] if "attention_output" in weight.path else shape[0]
            value = rng.standard_normal(shape) / np.sqrt(fan_in)
        weight.assign(value.astype(np.float32))
    return step


@functools.cache
def llama(seed: int = 0):
    """A tiny keras_hub Llama CausalLM (2 layers, width 64, grouped-query heads)."""
    from keras_hub_models import tiny_causal_lm

    return tiny_causal_lm("llama", seed)


# name -> (builder, max_length)
MODELS = {"step": (step_model, MAX_LENGTH), "llama": (llama, LLAMA_MAX_LENGTH)}
ATTENTIONS = ("gqa", "standard")
# What each backend exports: each model and each attention once per backend, and each
# (model, attention) on one of them (each export runs a verification: seconds).
EXPORTS = {
    "jax": (("step", "gqa"), ("llama", "standard")),
    "torch": (("step", "standard"), ("llama", "gqa")),
}
