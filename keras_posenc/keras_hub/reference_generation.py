"""Greedy generation by keras_hub itself: the reference a keras_hub export is verified against.

keras_hub keeps each row's tokens from cache slot 0 (its preprocessors pad on the right)
and generates as its `generate()` does: the prompt in one `call_with_cache`, then one
token per call from the shortest prompt's end on, a row taking its own prompt token
where it still has one and the argmax of its last logits after. The results are put in
the layout of `keras_posenc.export.decoder.greedy_generation` (prompts padded on the left), so
`check.compare_greedy` compares them with an ONNX run as it compares a step model's.
"""

from __future__ import annotations

import numpy as np

from keras_posenc.keras_hub import families, kv_caches


def _runs_eagerly(causal_lm) -> bool:
    """Whether keras_hub's attention cannot be traced for `causal_lm` (its family's
    `eager_reference`: 0.32's Qwen2 with its sliding window tests `cache_update_index`'s
    truth in Python, `OperatorNotAllowedInGraphError` in a graph); eager execution
    can, with the same arithmetic."""
    family = families.family_named(type(causal_lm).__name__)
    return family is not None and family.eager_reference(causal_lm)


def _empty_cache(causal_lm, batch: int, slots: int):
    """keras_hub's empty cache of `causal_lm`'s family (`kv_caches.stacked_cache` for a
    class of none)."""
    family = families.family_named(type(causal_lm).__name__)
    empty_cache = kv_caches.stacked_cache if family is None else family.empty_cache
    return empty_cache(causal_lm, batch, slots)


def _cached_call(causal_lm, cache):
    """`call_with_cache`, compiled where that is cheap: on TensorFlow a `tf.function` traced
    once for every batch, length and slot; on JAX under `jax.jit` with the weights passed in
    (as keras_hub's own `generate` compiles it); on PyTorch eager, without autograd; eager
    wherever keras_hub's own code cannot be traced (`_runs_eagerly`)."""
    import keras

    backend = keras.config.backend()
    if _runs_eagerly(causal_lm):
        return causal_lm.call_with_cache
    if backend == "jax":
        return _jax_cached_call(causal_lm)
    if backend == "torch":
        import torch

        def call(*args):
            with torch.no_grad():
                return causal_lm.call_with_cache(*args)

        return call
    if backend != "tensorflow":
        return causal_lm.call_with_cache
    import tensorflow as tf

    def spec(tensor):
        return tf.TensorSpec([None] * len(tensor.shape), tensor.dtype)

    signature = [
        tf.TensorSpec([None, None], tf.int32),
        tf.nest.map_structure(spec, cache),
        tf.TensorSpec([], tf.int32),
    ]
    return tf.function(causal_lm.call_with_cache, input_signature=signature)


def _jax_cached_call(causal_lm):
    """`call_with_cache` under `jax.jit`, the variables' values mapped in by a
    `StatelessScope` (one compilation per shape: the prompt's, then one token's)."""
    import itertools

    import jax
    import keras

    trainable, non_trainable = causal_lm.trainable_variables, causal_lm.non_trainable_variables

    @jax.jit
    def compiled(state, token_ids, cache, index):
        mapping = itertools.chain(
            zip(trainable, state[0], strict=True), zip(non_trainable, state[1], strict=True)
        )
        with keras.StatelessScope(state_mapping=mapping):
            return causal_lm.call_with_cache(token_ids, cache, index)

    state = ([v.value for v in trainable], [v.value for v in non_trainable])
    return lambda token_ids, cache, index: compiled(state, token_ids, cache, index)


def keras_hub_greedy(causal_lm):
    """`greedy(prompts, mask, steps) -> (tokens, logits)` of keras_hub `causal_lm` (see
    the module docstring); prompts `(batch, prompt)` padded on the left (`mask` 0)."""
    import keras

    backbone = causal_lm.backbone
    traced = []  # the traced call, made at the first generation

    def greedy(prompts: np.ndarray, mask: np.ndarray, steps: int):
        batch, width = prompts.shape
        lengths = mask.astype(bool).sum(axis=1)
        total = width + steps
        tokens = np.zeros((batch, total), np.int32)
        for row, length in enumerate(lengths):
            tokens[row, :length] = prompts[row, width - length :]
        cache = _empty_cache(causal_lm, batch, total)
        if not traced:
            traced.append(_cached_call(causal_lm, cache))
        call = traced[0]
        dtype = np.float64 if causal_lm.compute_dtype == "float64" else np.float32
        logits = np.zeros((batch, total, backbone.vocabulary_size), dtype)
        start = keras.ops.convert_to_tensor(0, "int32")
        out, _, cache = call(keras.ops.convert_to_tensor(tokens[:, :width]), cache, start)
        logits[:, :width] = keras.ops.convert_to_numpy(out)
        for slot in range(int(lengths.min()), total):
            generated = slot >= lengths
            tokens[generated, slot] = np.argmax(logits[generated, slot - 1], axis=-1)
            index = keras.ops.convert_to_tensor(slot, "int32")
            out, _, cache = call(
                keras.ops.convert_to_tensor(tokens[:, slot : slot + 1]), cache, index
            )
            logits[:, slot] = keras.ops.convert_to_numpy(out)[:, 0]
        # Back to the left-padded layout: step s of row r is slot length_r - 1 + s.
        prompt_logits = np.zeros((batch, width, logits.shape[-1]), dtype)
        slots = np.stack([lengths - 1 + s for s in range(steps + 1)], axis=1)  # (batch, steps+1)
        for row, length in enumerate(lengths):
            prompt_logits[row, width - length :] = logits[row, :length]
        step_logits = logits[np.arange(batch)[:, None], slots]  # (batch, steps+1, vocabulary)
        out_tokens = np.argmax(step_logits, axis=-1)
        return out_tokens, [prompt_logits, *step_logits[:, 1:].transpose(1, 0, 2)]

    return greedy
