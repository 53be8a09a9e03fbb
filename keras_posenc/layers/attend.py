"""Dot-product attention of rotated heads, Keras's way: the last step of the rotary attention call.

`RotaryAttention.call` (`keras_posenc.layers.rotary_attention_call`) projects, rotates and caches
the heads; this attends over them with the layer's own scale, dropout, masks and softmax.

The attention call is written once, in `keras.ops`, for every backend. Where a backend
needs its own op (TensorFlow: to keep the graphs it exports as they are) or has something
the others have not (values known while tracing, graph assertions, XLA or not), the call
asks `tricks()`: `keras_posenc.backend.tensorflow` on TensorFlow, `keras_posenc.backend.keras_ops`
on JAX and PyTorch, which give the same names.
"""

from __future__ import annotations

from keras import ops

from keras_posenc.backend import keras_private as private
from keras_posenc.backend.lazy import tricks  # noqa: F401  re-exported: the attention call asks it


def attend(
    layer, group_and_scale, query, key, value, mask, causal_only: bool, training, return_scores
):
    """Dot-product attention of `(batch, steps, heads, dim)` heads, Keras's way.

    Key/value heads are repeated for the query groups here, after the rotation (and
    after the cache). Without scores or active dropout this is Keras's
    `ops.dot_product_attention` (the backend's fused attention, flash when enabled);
    otherwise the explicit product and the base layer's masked softmax. `layer` is the
    `RotaryAttention` calling (its dropout and its Keras base's parts), `group_and_scale`
    its query heads per key/value head and its scale; returns `(output, scores or None)`.
    """
    group, scale = group_and_scale
    if group != 1:
        key = ops.repeat(key, group, axis=2)
        value = ops.repeat(value, group, axis=2)
    flash_attention = private.attention_part(layer, "flash_attention")
    if flash_attention and return_scores:
        raise ValueError(
            "Returning attention scores is not supported when flash attention is "
            "enabled. Please disable flash attention to access attention scores."
        )
    dropout = layer.dropout > 0.0 and bool(training)
    if not (return_scores or dropout):
        if causal_only:
            # What `is_causal=True` makes on the TensorFlow backend (no kernel of its
            # own there), but with built-in LiteRT ops: the backend's `mask[None, None]`
            # is a StridedSlice with new axes that LiteRT runs only as a Flex op.
            steps = ops.arange(ops.shape(query)[1])
            mask = ops.expand_dims(steps, 1) >= ops.expand_dims(ops.arange(ops.shape(key)[1]), 0)
        if mask is not None:
            mask = ops.cast(mask, "bool")
            while len(mask.shape) < 4:
                mask = ops.expand_dims(mask, axis=-3)  # the heads' axis
        output = ops.dot_product_attention(
            query,
            key,
            value,
            mask=mask,
            scale=scale,
            flash_attention=flash_attention,
        )
        return output, None
    if causal_only:
        mask = private.causal_mask(layer, query, value)
    query = ops.multiply(query, ops.cast(scale, query.dtype))
    scores = ops.einsum("btnh,bsnh->bnts", query, key)
    scores = private.masked_softmax(layer, scores, mask)
    dropout_layer = private.attention_part(layer, "dropout_layer")
    dropped = dropout_layer(scores, training=training) if dropout else scores
    return ops.einsum("bnts,bsnh->btnh", dropped, value), scores


def mask_without_cache(
    layer, window_and_chunk, query, value, masks: dict, attention_mask, use_causal_mask, starts
):
    """`(attention mask, causal_only)`: the base layer's mask from all the masks given,
    or none when the causal mask alone applies (`attend` then makes it itself).

    `layer` is the `RotaryAttention` calling (its Keras base makes the mask),
    `window_and_chunk` its sliding window and attention chunk (each None for none). Chunks
    count from the index of each token in the sequence, `starts` (the first query's and the
    first key's) on: the index, as for the temperature, not the positions (Llama 4's
    `cache_position`).
    """
    window, chunk_size = window_and_chunk
    causal_only = (
        use_causal_mask
        and all(mask is None for mask in masks.values())
        and attention_mask is None
        and window is None
        and chunk_size is None
    )
    if not causal_only:
        attention_mask = private.attention_mask(
            layer,
            query,
            value,
            **masks,
            attention_mask=attention_mask,
            use_causal_mask=use_causal_mask,
        )
        key_padding = masks["key_mask"] if masks["key_mask"] is not None else masks["value_mask"]
        if key_padding is None and query is value:  # self-attention: the queries' padding
            key_padding = masks["query_mask"]
        attention_mask = within_chunks(
            attention_mask,
            chunk_size,
            (tricks().run_time_size(query, 1), tricks().run_time_size(value, 1)),
            starts,
            (masks["query_mask"], key_padding),
        )
    return attention_mask, causal_only


def tempered(queries, temperature, first_index):
    """`(batch, steps, heads, dim)` queries times `temperature` (an `AttentionTemperature`,
    or None: unchanged) at each query's index in the sequence, `first_index + step`.

    Llama 4's index, cache included: positions and padding do not move it.
    """
    if temperature is None:
        return queries
    steps = ops.arange(tricks().run_time_size(queries, 1), dtype="int32")
    index = ops.cast(first_index, "int32") + steps
    scale = ops.reshape(temperature(index), [1, -1, 1, 1])
    wide = tricks().accumulation_dtype(queries.dtype)
    return ops.cast(ops.cast(queries, wide) * ops.cast(scale, wide), queries.dtype)


def within_chunks(mask, chunk_size: int | None, sizes, start_indices, padding_masks):
    """`mask` (None or `(batch, steps, sources)`) and-ed with Llama 4's chunked attention.

    Query `i` sees key `j` only when `(s + i - p) // chunk_size == (s' + j - p') //
    chunk_size`: `s`, `s'` the index in the sequence of the first query and of the first key
    (`start_indices`, as `query_start_index` / `key_start_index` give them), `p`, `p'` the
    left padding of the queries' and the keys' rows (`padding_masks`, each None or
    `(batch, length)`), so that chunks start at a row's first real token, as transformers
    counts them. `sizes` is `(steps, sources)`.
    """
    if chunk_size is None:
        return mask
    chunks = [
        chunk_of(ops.cast(start, "int32") + ops.arange(size, dtype="int32"), padding, chunk_size)
        for size, start, padding in zip(sizes, start_indices, padding_masks, strict=True)
    ]
    # expand_dims, not `[None]`: LiteRT runs a new-axis StridedSlice only as a Flex op.
    same = ops.equal(ops.expand_dims(chunks[0], -1), ops.expand_dims(chunks[1], -2))
    if len(same.shape) == 2:
        same = ops.expand_dims(same, 0)
    return same if mask is None else ops.logical_and(ops.cast(mask, "bool"), same)


def chunk_of(index, padding_mask, chunk_size: int):
    """The chunk of each token `index` (`(length,)`): `(length,)`, or `(batch, length)` counted
    from each row's first real token when `padding_mask` `(batch, length)` is given."""
    if padding_mask is None:
        return ops.floor_divide(index, chunk_size)
    real = ops.cast(ops.cast(padding_mask, "bool"), "int32")
    left_padding = ops.sum(ops.cast(ops.equal(ops.cumsum(real, axis=1), 0), "int32"), 1)
    return ops.floor_divide(
        ops.expand_dims(index, 0) - ops.expand_dims(left_padding, 1), chunk_size
    )
