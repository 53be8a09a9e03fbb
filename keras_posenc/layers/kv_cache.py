"""The key/value cache's parts: its update index, the write, and the slots' checks.

A cache is `(batch, 2, max_length, num_key_value_heads, head_dim)`, keys (rotated) and
values; a call writes its new tokens at `cache_update_index` and keeps every shape static.
Written in `keras.ops` for every backend; what differs between them comes from `tricks()`
(`keras_posenc.backend.lazy`): values known while tracing, graph assertions, the kind of write.
"""

from __future__ import annotations

import keras
import numpy as np
from keras import ops

from keras_posenc.layers.attend import chunk_of, tricks


def _dtype(x) -> str:
    return keras.backend.standardize_dtype(x.dtype)


def _rank(x) -> int | None:
    """The rank of `x`, None where unknown (a TensorFlow graph)."""
    return x.shape.rank if hasattr(x.shape, "rank") else len(x.shape)


def _shape_text(x) -> str:
    """`x.shape` as TensorFlow prints it: `(2, None, 8)`, `<unknown>` for an unknown rank."""
    if _rank(x) is None:
        return "<unknown>"
    return "(" + ", ".join(str(size) for size in x.shape) + ("," if _rank(x) == 1 else "") + ")"


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
    if dtype is not None and "int" not in _dtype(value):
        raise TypeError(f"{what}, got a {_dtype(value)} value.")
    known = tricks().static_value(value)
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
    index = ops.convert_to_tensor(cache_update_index)
    if "int" not in _dtype(index) or _rank(index) not in (None, 0):
        raise TypeError(
            "cache_update_index must be a scalar int32 or int64, got "
            f"{_dtype(index)} of shape {_shape_text(index)}. It is the cache slot of the "
            "first new token (the number of tokens already in the cache)."
        )
    if _dtype(index) != "int32":
        index = tricks().as_int32_positions(index)  # saturated: 2^32 + 5 is not 5
    return index


def static_size(x, axis: int):
    """`x.shape[axis]` as a Python int when known, else the run-time size."""
    return int(x.shape[axis]) if x.shape[axis] is not None else tricks().run_time_size(x, axis)


def columns(x, start, length):
    """`x[:, start : start + length]` for a run-time `start`.

    A gather, not `tf.slice(x, [0, start], [-1, length])`: XLA needs the begin of a slice
    whose size is -1 at compile time, and would compile the step again for every start.
    """
    # Clamped: a start past the cache is refused (or its outputs made NaN) by the caller,
    # and onnxruntime would otherwise fail here with an error that does not name it.
    columns = ops.clip(
        start + ops.arange(length, dtype="int32"), 0, tricks().run_time_size(x, 1) - 1
    )
    return tricks().take(x, columns, axis=1)


def written(cache, update, index, new, max_length: int):
    """`cache (batch, 2, max_length, ...)` with `update (batch, 2, new, ...)` at slot `index`."""
    if tricks().writes_in_place():
        # A dynamic update slice (XLA, JAX; torch eagerly): the new slots written into a
        # copy of the cache, at a run-time index without another compilation.
        return ops.slice_update(cache, [0, 0, index, 0, 0], update)
    # Elsewhere (TensorFlow without XLA) the same as a select between the cache and the
    # update gathered to every slot: tf2onnx cannot convert XlaDynamicUpdateSlice, and a
    # select exports anywhere.
    offset = ops.arange(max_length, dtype="int32") - index
    inside = (offset >= 0) & (offset < new)
    placed = tricks().take(update, ops.clip(offset, 0, new - 1), axis=2)
    return ops.where(inside[None, None, :, None, None], placed, cache)


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
    return tricks().asserted(
        valid,
        [
            f"cache_update_index plus the new tokens must stay within the cache's "
            f"max_length {max_length}; cache_update_index and the new tokens follow.",
            index,
            new,
        ],
    )


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


def checked_cache(cache, kv_heads: int, key_dim: int, value_dim: int) -> tuple:
    """`(cache as a tensor, its max_length)`, or a ValueError saying what shape it needs."""
    cache = ops.convert_to_tensor(cache)
    if key_dim != value_dim:
        raise ValueError(
            f"A cache holds keys and values of one size, but key_dim={key_dim} and "
            f"value_dim={value_dim}; leave value_dim None to use a cache."
        )
    shape = cache.shape
    if _rank(cache) != 5 or shape[1] != 2 or shape[3] != kv_heads or shape[4] != key_dim:
        raise ValueError(
            "cache must have shape (batch, 2, max_length, num_key_value_heads, head_dim) "
            f"= (batch, 2, max_length, {kv_heads}, {key_dim}), got {_shape_text(cache)}."
        )
    if shape[2] is None:
        raise ValueError("The cache's max_length (axis 2) must be known, got None.")
    if "float" not in _dtype(cache):
        raise TypeError(
            f"cache must hold floating-point keys and values, got {_dtype(cache)}: an "
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
    size = tricks().run_time_size
    same = ops.equal(size(queries, 0), size(cache, 0))
    same = tricks().asserted(same, ["The cache's batch is not the queries' batch:", size(cache, 0)])
    if cache_mask is not None:
        # A batch-1 mask would broadcast: every row given row 0's padding.
        same_mask = tricks().asserted(
            ops.equal(size(cache_mask, 0), size(cache, 0)),
            [
                "cache_mask has a batch other than the cache: give one row of cache_mask "
                "per cache row, (batch, max_length). The batches of cache_mask and cache:",
                size(cache_mask, 0),
                size(cache, 0),
            ],
        )
        same = same & same_mask
    return same


def checked_cache_mask(cache_mask, max_length: int):
    """`cache_mask` (None, or one entry per slot and batch row) as a tensor."""
    if cache_mask is None:
        return None
    cache_mask = ops.convert_to_tensor(cache_mask)
    if _rank(cache_mask) != 2 or cache_mask.shape[1] not in (None, max_length):
        raise ValueError(
            f"cache_mask must have shape (batch, max_length={max_length}), "
            f"got {_shape_text(cache_mask)}: one entry per cache slot, false for padding."
        )
    return cache_mask


def checked_attention_mask(attention_mask, queries, steps, max_length: int):
    """`(attention_mask, validity)` with a cache: the mask `(batch, steps, max_length)` over
    the slots as a tensor (or None), and None or a scalar validity tensor of its shape.

    Sizes known now are checked now (`queries` gives the batch). Sizes known only at run
    time are asserted in a graph; since the converters drop assertions and a boolean mask
    cannot carry NaN, the caller folds the validity into its NaN selection: a mask of other
    steps would otherwise broadcast over the queries, or another batch over the rows.
    """
    if attention_mask is None:
        return None, None
    attention_mask = ops.convert_to_tensor(attention_mask)
    shape = attention_mask.shape
    known_steps = steps if isinstance(steps, int) else None
    if _rank(attention_mask) != 3 or any(
        size is not None and want is not None and size != want
        for size, want in zip(shape[1:], (known_steps, max_length), strict=True)
    ):
        raise ValueError(
            f"attention_mask with a cache must be (batch, {known_steps or 'steps'}, "
            f"{max_length}): one entry per new query and cache slot, got "
            f"{_shape_text(attention_mask)}."
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
    sizes = tricks().run_time_shape(attention_mask)
    wanted = ops.stack([tricks().run_time_size(queries, 0), ops.cast(steps, "int32"), max_length])
    fits = ops.all(ops.equal(sizes[1:], wanted[1:]))
    fits = fits & ops.equal(sizes[0], wanted[0]) | ops.equal(sizes[0], 1)
    fits = tricks().asserted(
        fits,
        [
            "attention_mask with a cache must be (batch or 1, steps, max_length): one "
            "entry per row, new query and cache slot. Its sizes, then the wanted ones:",
            sizes,
            wanted,
        ],
    )
    return attention_mask, fits


def visible_slots(sizes, causal: bool, limits, masks):
    """Which cache slots each new query sees: `(batch or 1, steps, max_length)` bools.

    `sizes` is `(index, steps, new, max_length)`; `limits` `(window, chunk_size)`, each
    None or applied; `masks` `(cache_mask, query_mask, attention_mask)`, likewise. Only
    filled slots (below `index + new`) are seen; `causal` hides later ones, `window` those
    `window` or more slots away, `chunk_size` those of another chunk of that many slots.
    """
    index, steps, new, max_length = sizes
    window, chunk_size = limits
    cache_mask, query_mask, attention_mask = masks
    slot = ops.arange(max_length, dtype="int32")[None, None, :]
    query_slot = index + ops.arange(steps, dtype="int32")[None, :, None]
    # (`visible = visible & (...)`, not `&=`: torch's in-place `&=` does not broadcast.)
    visible = slot < index + new  # the filled part only
    if causal:
        visible = visible & (slot <= query_slot)
    if window is not None:
        visible = visible & (ops.abs(query_slot - slot) < window)
    if chunk_size is not None:
        # Chunks count from a row's first real slot (transformers' left padding).
        slot_chunk = chunk_of(ops.arange(max_length, dtype="int32"), cache_mask, chunk_size)
        if cache_mask is None:
            slot_chunk = ops.expand_dims(slot_chunk, 0)
        query_chunk = columns(slot_chunk, index, steps)
        visible = visible & (ops.expand_dims(query_chunk, -1) == ops.expand_dims(slot_chunk, -2))
    if cache_mask is not None:
        visible = visible & ops.cast(cache_mask, "bool")[:, None, :]
    if query_mask is not None:
        visible = visible & ops.cast(query_mask, "bool")[:, :, None]
    if attention_mask is not None:
        visible = visible & ops.cast(attention_mask, "bool")
    return visible


def checked_cache_step(cache_at, kv_head_dims, query_heads, key_heads, attention_mask):
    """A cached call's cache, masks and sizes, checked: `(cache, cache_mask, attention_mask,
    (index, steps, new, max_length), valid)`.

    `cache_at` is `(cache, cache_update_index, cache_mask)`, `kv_head_dims` the layer's
    key/value heads, key and value sizes; `valid` is None, or where the traced checks hold
    (their rows become NaN).
    """
    cache, cache_update_index, cache_mask = cache_at
    cache, max_length = checked_cache(cache, *kv_head_dims)
    if cache_update_index is None:
        raise ValueError(
            "A cache needs cache_update_index: the slot of the first new token (the "
            "number of tokens already in the cache; 0 for the prefill)."
        )
    index = checked_update_index(cache_update_index)
    steps, new = static_size(query_heads, 1), static_size(key_heads, 1)

    valid = checked_slots(index, new, max_length)
    cache_mask = checked_cache_mask(cache_mask, max_length)
    same_batch = checked_batches(cache, query_heads, cache_mask)
    attention_mask, mask_fits = checked_attention_mask(
        attention_mask, query_heads, steps, max_length
    )
    for validity in (same_batch, mask_fits):
        if validity is not None:
            valid = validity if valid is None else valid & validity
    return cache, cache_mask, attention_mask, (index, steps, new, max_length), valid


def checked_call_without_cache(cache_update_index, cache_mask) -> None:
    """Refuses a cache's arguments in a call without a cache."""
    if cache_update_index is not None or cache_mask is not None:
        raise ValueError(
            "cache_update_index and cache_mask need a `cache` (batch, 2, max_length, "
            "num_key_value_heads, head_dim); without one, give positions as "
            "query_positions / query_start_index."
        )
