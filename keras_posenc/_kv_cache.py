"""The key/value cache's parts: its update index, the write, and the slots' checks.

A cache is `(batch, 2, max_length, num_key_value_heads, head_dim)`, keys (rotated) and
values; a call writes its new tokens at `cache_update_index` and keeps every shape static.
"""

from __future__ import annotations

import numpy as np
from keras import ops

from keras_posenc._attend import chunk_of
from keras_posenc._lazy import _tf, tf


def known_int(value, name: str = "cache_update_index"):
    """`value` as a Python int when it is known now (a number, eager or constant), else None.

    Raises:
        TypeError: `value` is not an integer (a float, a string, a bool, a float tensor) or
            not a scalar: nothing is truncated or broadcast into a slot.
    """
    what = f"{name} must be an integer (the cache slot of the first new token)"
    if isinstance(value, (bool, np.bool_, float, np.floating, str, bytes)):
        raise TypeError(f"{what}, got {value!r}.")
    if isinstance(value, (int, np.integer)):
        return int(value)
    dtype = getattr(value, "dtype", None)
    if dtype is not None and not tf.as_dtype(dtype).is_integer:
        raise TypeError(f"{what}, got a {tf.as_dtype(dtype).name} value.")
    known = tf.get_static_value(value)
    if known is None:
        return None
    known = np.asarray(known)
    if known.ndim:
        raise TypeError(
            f"{name} must be a scalar, got shape {known.shape}: pass the slot itself "
            f"(index[0] of a one-element array)."
        )
    if not np.issubdtype(known.dtype, np.integer):
        raise TypeError(f"{what}, got {known!r}.")
    return int(known)


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
    if _tf.in_xla_context():
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
    known_index, known_new = known_int(index), known_int(new, "the number of new tokens")
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


def checked_cache_call(return_scores, value_mask, key_mask, query_at, key_at) -> None:
    """Refuses what a call with a cache cannot do: scores, key masks, start indices
    (`query_at`, `key_at`: `(positions, start_index)`)."""
    query_start, key_start = query_at[1], key_at[1]
    if return_scores:
        raise ValueError(
            "return_attention_scores is not supported with a cache; call without "
            "one (the full causal pass gives the same outputs) to see the scores."
        )
    if value_mask is not None or key_mask is not None:
        raise ValueError(
            "With a cache the keys are the cache's slots: give their padding as "
            "cache_mask (batch, max_length), not value_mask / key_mask (this call's "
            "tokens only; they would be forgotten at the next step)."
        )
    if not (
        isinstance(query_start, (int, np.integer))
        and isinstance(key_start, (int, np.integer))
        and query_start == key_start == 0
    ):
        raise ValueError(
            "With a cache the positions run from cache_update_index: pass "
            "query_positions / key_positions for others, not start indices."
        )


def checked_cache(cache, kv_heads: int, key_dim: int, value_dim: int) -> tuple[tf.Tensor, int]:
    """`(cache as a tensor, its max_length)`, or a ValueError saying what shape it needs."""
    cache = tf.convert_to_tensor(cache)
    if key_dim != value_dim:
        raise ValueError(
            f"A cache holds keys and values of one size, but key_dim={key_dim} and "
            f"value_dim={value_dim}; leave value_dim None to use a cache."
        )
    shape = cache.shape
    if shape.rank != 5 or shape[1] != 2 or shape[3] != kv_heads or shape[4] != key_dim:
        raise ValueError(
            "cache must have shape (batch, 2, max_length, num_key_value_heads, head_dim) "
            f"= (batch, 2, max_length, {kv_heads}, {key_dim}), got {shape}."
        )
    if shape[2] is None:
        raise ValueError("The cache's max_length (axis 2) must be known, got None.")
    if not cache.dtype.is_floating:
        raise TypeError(
            f"cache must hold floating-point keys and values, got {cache.dtype.name}: an "
            "integer cache would truncate them. Start from np.zeros(shape, 'float32')."
        )
    return cache, int(shape[2])


def checked_batches(cache, queries, cache_mask):
    """Refuses a cache (or cache_mask) whose batch is not the queries' where both are known;
    else a scalar validity tensor (None when known equal) that makes the outputs NaN.

    Broadcasting a batch-1 cache over a larger batch would answer every row with the
    first row's history: plausible, and wrong.
    """
    batch, cache_batch = queries.shape[0], cache.shape[0]
    if batch is not None and cache_batch is not None and batch != cache_batch:
        raise ValueError(
            f"The cache has batch {cache_batch} but the queries {batch}: give each row "
            "its own cache, (batch, 2, max_length, num_key_value_heads, head_dim)."
        )
    if cache_mask is not None:
        mask_batch = cache_mask.shape[0]
        if mask_batch is not None and cache_batch is not None and mask_batch != cache_batch:
            raise ValueError(
                f"cache_mask has batch {mask_batch} but the cache {cache_batch}: one row "
                "of cache_mask per cache row, (batch, max_length)."
            )
    mask_known = cache_mask is None or (cache_mask.shape[0] is not None and cache_batch is not None)
    if batch is not None and cache_batch is not None and mask_known:
        return None
    same = tf.equal(tf.shape(queries)[0], tf.shape(cache)[0])
    if not tf.executing_eagerly():
        same = _asserted(same, ["The cache's batch is not the queries' batch:", tf.shape(cache)[0]])
    if cache_mask is not None:
        # A batch-1 mask would broadcast: every row given row 0's padding.
        same_mask = tf.equal(tf.shape(cache_mask)[0], tf.shape(cache)[0])
        if not tf.executing_eagerly():
            same_mask = _asserted(
                same_mask,
                [
                    "cache_mask has a batch other than the cache: give one row of cache_mask "
                    "per cache row, (batch, max_length). The batches of cache_mask and cache:",
                    tf.shape(cache_mask)[0],
                    tf.shape(cache)[0],
                ],
            )
        same &= same_mask
    return same


def _asserted(condition: tf.Tensor, message: list) -> tf.Tensor:
    """`condition`, after an assertion of it (in a graph; XLA and the converters drop it)."""
    assertion = tf.debugging.Assert(condition, message)
    with tf.control_dependencies([assertion]):
        return tf.identity(condition)


def checked_cache_mask(cache_mask, max_length: int):
    """`cache_mask` (None, or one entry per slot and batch row) as a tensor."""
    if cache_mask is None:
        return None
    cache_mask = tf.convert_to_tensor(cache_mask)
    if cache_mask.shape.rank != 2 or cache_mask.shape[1] not in (None, max_length):
        raise ValueError(
            f"cache_mask must have shape (batch, max_length={max_length}), "
            f"got {cache_mask.shape}: one entry per cache slot, false for padding."
        )
    return cache_mask


def checked_attention_mask(attention_mask, queries: tf.Tensor, steps, max_length: int):
    """`(attention_mask, validity)` with a cache: the mask `(batch, steps, max_length)` over
    the slots as a tensor (or None), and None or a scalar validity tensor of its shape.

    Sizes known now are checked now (`queries` gives the batch). Sizes known only at run
    time are asserted in a graph; since the converters drop assertions and a boolean mask
    cannot carry NaN, the caller folds the validity into its NaN selection: a mask of other
    steps would otherwise broadcast over the queries, or another batch over the rows.
    """
    if attention_mask is None:
        return None, None
    attention_mask = tf.convert_to_tensor(attention_mask)
    shape = attention_mask.shape
    known_steps = steps if isinstance(steps, int) else None
    if shape.rank != 3 or any(
        size is not None and want is not None and size != want
        for size, want in zip(shape[1:], (known_steps, max_length), strict=True)
    ):
        raise ValueError(
            f"attention_mask with a cache must be (batch, {known_steps or 'steps'}, "
            f"{max_length}): one entry per new query and cache slot, got {shape}."
        )
    batch = queries.shape[0]
    if shape[0] not in (None, 1) and batch is not None and shape[0] != batch:
        raise ValueError(
            f"attention_mask has batch {shape[0]} but the queries {batch}: give one "
            f"(steps, max_length) mask per row, (batch, {known_steps or 'steps'}, {max_length}), "
            "or one for every row, (1, steps, max_length)."
        )
    if None not in (shape[0], batch, shape[1], known_steps):
        return attention_mask, None
    # Sizes known only at run time: a (batch, 1, max_length) mask would broadcast over
    # the queries, which eagerly is refused above (a batch-1 mask is every row's).
    sizes = tf.shape(attention_mask)
    wanted = tf.stack([tf.shape(queries)[0], tf.cast(steps, tf.int32), max_length])
    fits = tf.reduce_all(tf.equal(sizes[1:], wanted[1:]))
    fits &= tf.equal(sizes[0], wanted[0]) | tf.equal(sizes[0], 1)
    if not tf.executing_eagerly():
        fits = _asserted(
            fits,
            [
                "attention_mask with a cache must be (batch or 1, steps, max_length): one "
                "entry per row, new query and cache slot. Its sizes, then the wanted ones:",
                sizes,
                wanted,
            ],
        )
    return attention_mask, fits


def visible_slots(sizes, causal: bool, limits, masks) -> tf.Tensor:
    """Which cache slots each new query sees: `(batch or 1, steps, max_length)` bools.

    `sizes` is `(index, steps, new, max_length)`; `limits` `(window, chunk_size)`, each
    None or applied; `masks` `(cache_mask, query_mask, attention_mask)`, likewise. Only
    filled slots (below `index + new`) are seen; `causal` hides later ones, `window` those
    `window` or more slots away, `chunk_size` those of another chunk of that many slots.
    """
    index, steps, new, max_length = sizes
    window, chunk_size = limits
    cache_mask, query_mask, attention_mask = masks
    slot = tf.range(max_length)[None, None, :]
    query_slot = index + tf.range(steps)[None, :, None]
    visible = slot < index + new  # the filled part only
    if causal:
        visible &= slot <= query_slot
    if window is not None:
        visible &= tf.abs(query_slot - slot) < window
    if chunk_size is not None:
        # Chunks count from a row's first real slot (transformers' left padding).
        slot_chunk = chunk_of(tf.range(max_length), cache_mask, chunk_size)
        if cache_mask is None:
            slot_chunk = tf.expand_dims(slot_chunk, 0)
        query_chunk = columns(slot_chunk, index, steps)
        visible &= tf.expand_dims(query_chunk, -1) == tf.expand_dims(slot_chunk, -2)
    if cache_mask is not None:
        visible &= tf.cast(cache_mask, tf.bool)[:, None, :]
    if query_mask is not None:
        visible &= tf.cast(query_mask, tf.bool)[:, :, None]
    if attention_mask is not None:
        visible &= tf.cast(attention_mask, tf.bool)
    return visible
