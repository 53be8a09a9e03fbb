"""The key/value cache's parts: its update index, the write, and the slots' checks.

A cache is `(batch, 2, max_length, num_key_value_heads, head_dim)`, keys (rotated) and
values; a call writes its new tokens at `cache_update_index` and keeps every shape static.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf
from keras import ops

from keras_posenc._tf import in_xla_context


def known_int(value):
    """`value` as a Python int when it is known now (a number, eager or constant), else None."""
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(f"cache_update_index must be an integer, got the bool {value!r}.")
    if isinstance(value, (int, np.integer)):
        return int(value)
    known = tf.get_static_value(value)
    return None if known is None else int(known)


def checked_update_index(cache_update_index):
    """`cache_update_index` as a Python int or a scalar int32 tensor."""
    if known_int(cache_update_index) is not None:
        return known_int(cache_update_index)
    index = tf.convert_to_tensor(cache_update_index)
    if not index.dtype.is_integer or index.shape.rank not in (None, 0):
        raise TypeError(
            "cache_update_index must be a scalar int32 or int64, got "
            f"{index.dtype.name} of shape {index.shape}. It is the cache slot of the first "
            "new token (the number of tokens already in the cache)."
        )
    if index.dtype != tf.int32:
        bounds = np.iinfo(np.int32)
        index = tf.clip_by_value(tf.cast(index, tf.int64), bounds.min, bounds.max)
    return tf.cast(index, tf.int32)


def static_size(x: tf.Tensor, axis: int):
    """`x.shape[axis]` as a Python int when known, else the run-time size."""
    return int(x.shape[axis]) if x.shape[axis] is not None else tf.shape(x)[axis]


def columns(x: tf.Tensor, start, length) -> tf.Tensor:
    """`x[:, start : start + length]` for a run-time `start`.

    A gather, not `tf.slice(x, [0, start], [-1, length])`: XLA needs the begin of a slice
    whose size is -1 at compile time, and would compile the step again for every start.
    """
    # Clamped: a start past the cache is refused (or its outputs made NaN) by the caller,
    # and onnxruntime would otherwise fail here with an error that does not name it.
    columns = tf.clip_by_value(start + tf.range(length), 0, tf.shape(x)[1] - 1)
    return tf.gather(x, columns, axis=1)


def written(cache: tf.Tensor, update: tf.Tensor, index, new, max_length: int) -> tf.Tensor:
    """`cache (batch, 2, max_length, ...)` with `update (batch, 2, new, ...)` at slot `index`."""
    if in_xla_context():
        # A dynamic update slice: XLA writes the new slots into a copy of the cache.
        return ops.slice_update(cache, [0, 0, index, 0, 0], update)
    # Elsewhere the same as a select between the cache and the update gathered to every
    # slot: tf2onnx cannot convert XlaDynamicUpdateSlice, and a select exports anywhere.
    offset = tf.range(max_length) - index
    inside = (offset >= 0) & (offset < new)
    placed = tf.gather(update, tf.clip_by_value(offset, 0, new - 1), axis=2)
    return tf.where(inside[None, None, :, None, None], placed, cache)


def checked_slots(index, new, max_length: int):
    """None when `index .. index + new` fits the cache, checked now; else a validity tensor.

    A slot past the cache would be clamped by the update (a plausible wrong answer):
    eagerly that is an error now, in a graph an assertion, and since XLA and the
    converters (tf2onnx, TFLite) drop assertions, the new queries, keys and values of
    every graph also become NaN.
    """
    known_index, known_new = known_int(index), known_int(new)
    if known_index is not None and known_new is not None:
        if not 0 <= known_index <= max_length - known_new:
            raise ValueError(
                f"cache_update_index={known_index} with {known_new} new tokens does not "
                f"fit a cache of max_length {max_length}: it must be in "
                f"[0, {max_length - known_new}]."
            )
        return None
    valid = (index >= 0) & (index <= max_length - new)
    if not tf.executing_eagerly():
        assertion = tf.debugging.Assert(
            valid,
            [
                f"cache_update_index plus the new tokens must stay within the cache's "
                f"max_length {max_length}; cache_update_index and the new tokens follow.",
                index,
                new,
            ],
        )
        with tf.control_dependencies([assertion]):
            valid = tf.identity(valid)
    return valid
