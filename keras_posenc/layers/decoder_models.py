"""`decoder_models`: the training model and the decode-step model of one stack of `DecoderBlock`s.

The step model is the convention `keras_posenc.export.save_decoder` reads: inputs
`token_ids` `(batch, sequence)` int32, `cache` `(batch, num_layers, 2, max_length,
num_key_value_heads, head_dim)` (keras_hub's CausalLM layout), scalar `cache_update_index`
and `padding_mask` `(batch, max_length)` (0 for padding slots); outputs `logits` and
`next_cache`. Both models share their layers (and so their weights).
"""

from __future__ import annotations

import keras

from keras_posenc.layers.decoder_block import DecoderBlock


def decoder_models(
    embedding: keras.layers.Embedding,
    blocks: list[DecoderBlock],
    final_norm: keras.layers.RMSNormalization,
    head: keras.layers.Dense,
    max_length: int,
    name: str = "decoder",
) -> tuple[keras.Model, keras.Model]:
    """`(training model, decode-step model)` of `embedding -> blocks -> final_norm -> head`.

    Example:

    >>> blocks = [DecoderBlock(16, 4, 2, 128, name=f"block_{i}") for i in range(2)]
    >>> train, step = decoder_models(
    ...     keras.layers.Embedding(100, 64), blocks, keras.layers.RMSNormalization(),
    ...     keras.layers.Dense(100, use_bias=False), max_length=32)
    >>> tuple(train(np.zeros((2, 5), "int32")).shape)
    (2, 5, 100)
    >>> out = step({"token_ids": np.zeros((2, 5), "int32"),
    ...             "cache": np.zeros((2, 2, 2, 32, 2, 16), "float32"),
    ...             "cache_update_index": np.int32(0),
    ...             "padding_mask": np.ones((2, 32), "int32")})
    >>> tuple(out["logits"].shape), tuple(out["next_cache"].shape)
    ((2, 5, 100), (2, 2, 2, 32, 2, 16))

    The training model maps `token_ids` `(batch, sequence)` to logits with a causal mask.
    """
    if not blocks or not all(isinstance(block, DecoderBlock) for block in blocks):
        raise TypeError("blocks must be a non-empty list of keras_posenc.DecoderBlock layers.")
    first = blocks[0]
    cache_shape = (len(blocks), 2, int(max_length), first.num_key_value_heads, first.head_dim)
    ids = keras.Input((None,), dtype="int32", name="token_ids")
    cache = keras.Input(cache_shape, name="cache")
    index = keras.Input(batch_shape=(), dtype="int32", name="cache_update_index")
    padding = keras.Input((int(max_length),), dtype="int32", name="padding_mask")
    # The cached call first: Keras checks a functional model's connections with the
    # outputs of each layer's first call, and the cached call has one more (the cache).
    x = embedding(ids)
    caches = []
    for i, block in enumerate(blocks):
        x, layer_cache = block(x, cache=cache[:, i], cache_update_index=index, cache_mask=padding)
        caches.append(layer_cache)
    outputs = {
        "logits": keras.layers.Identity(name="logits")(head(final_norm(x))),
        "next_cache": keras.layers.Identity(name="next_cache")(keras.ops.stack(caches, axis=1)),
    }
    step = keras.Model([ids, cache, index, padding], outputs, name=f"{name}_step")
    x = embedding(ids)
    for block in blocks:
        x = block(x)
    train = keras.Model(ids, head(final_norm(x)), name=name)
    return train, step
