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


def keras_greedy(step_model, prompts: np.ndarray, mask: np.ndarray, steps: int):
    """Through the step model's own convention (cache slot = column, positions from the mask)."""
    import tensorflow as tf

    batch, length = prompts.shape
    cache_spec = step_model.inputs[1]
    cache = tf.zeros((batch, *cache_spec.shape[1:]), cache_spec.dtype)
    max_length = cache_spec.shape[3]
    padding = np.ones((batch, max_length), np.int32)
    padding[:, :length] = mask
    call = tf.function(lambda feeds: step_model(feeds), reduce_retracing=True)
    ids, index, logits, tokens = prompts.astype(np.int32), 0, [], []
    for _ in range(steps + 1):
        out = call(
            {
                "token_ids": tf.constant(ids),
                "cache": cache,
                "cache_update_index": tf.constant(index, tf.int32),
                "padding_mask": tf.constant(padding),
            }
        )
        cache = out["next_cache"]
        step_logits = out["logits"].numpy()
        logits.append(step_logits if not logits else step_logits[:, -1])
        tokens.append(np.argmax(step_logits[:, -1], axis=-1))
        index += ids.shape[1]
        ids = tokens[-1][:, None].astype(np.int32)
    return np.stack(tokens, 1), logits
