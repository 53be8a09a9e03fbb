"""Greedy generation after a prompt: Keras (the step model), onnxruntime (the genai interface).

Both take `prompts` `(batch, prompt)` int and `mask` of the same shape (0 for left
padding), run the prompt in one call and then `steps` single-token calls, each fed the
argmax of the last, and return `(tokens (batch, steps + 1), logits)`: `logits[0]` the
prompt's `(batch, prompt, vocabulary)`, `logits[1:]` each step's `(batch, vocabulary)`.
"""

from __future__ import annotations

import numpy as np

# The onnxruntime runner lives in the keras-free serving package; re-exported for its callers.
from keras_posenc_serve.session import SharedCacheSession, onnx_greedy  # noqa: F401


def _compiled(model):
    """`model`'s call, compiled where that is cheap: a `tf.function` on TensorFlow, its
    `stateless_call` under `jax.jit` on JAX (the weights passed in, not baked into the
    program); eager on PyTorch, without autograd (the cache would carry every step's graph)."""
    import keras

    backend = keras.backend.backend()
    if backend == "tensorflow":
        import tensorflow as tf

        return tf.function(lambda feeds: model(feeds), reduce_retracing=True)
    if backend == "jax":
        import jax

        state = (
            [v.value for v in model.trainable_variables],
            [v.value for v in model.non_trainable_variables],
        )
        stateless = jax.jit(lambda state, feeds: model.stateless_call(*state, feeds)[0])
        return lambda feeds: stateless(state, feeds)
    if backend == "torch":
        import torch

        def call(feeds):
            with torch.no_grad():
                return model(feeds)

        return call
    return model


def keras_greedy(step_model, prompts: np.ndarray, mask: np.ndarray, steps: int):
    """Through the step model's own convention (cache slot = column, positions from the
    mask), on the Keras backend of this process (`_compiled`)."""
    import keras

    batch, length = prompts.shape
    cache_spec = step_model.inputs[1]
    cache = keras.ops.zeros((batch, *cache_spec.shape[1:]), cache_spec.dtype)
    max_length = cache_spec.shape[3]
    padding = np.ones((batch, max_length), np.int32)
    padding[:, :length] = mask
    padding = keras.ops.convert_to_tensor(padding)
    call = _compiled(step_model)
    ids, index, logits, tokens = prompts.astype(np.int32), 0, [], []
    for _ in range(steps + 1):
        out = call(
            {
                "token_ids": keras.ops.convert_to_tensor(ids),
                "cache": cache,
                "cache_update_index": keras.ops.convert_to_tensor(index, "int32"),
                "padding_mask": padding,
            }
        )
        cache = out["next_cache"]
        step_logits = keras.ops.convert_to_numpy(out["logits"])
        logits.append(step_logits if not logits else step_logits[:, -1])
        tokens.append(np.argmax(step_logits[:, -1], axis=-1))
        index += ids.shape[1]
        ids = tokens[-1][:, None].astype(np.int32)
    return np.stack(tokens, 1), logits
