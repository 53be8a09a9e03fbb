"""The attention cases run on every backend: `RotaryMultiHeadAttention`,
`RotaryGroupQueryAttention` (with and without a KV cache) and a `decoder_models` step.

One definition, run under TensorFlow by tests/test_backends.py (its results the
subprocesses compare with) and under JAX / torch by tests/backends/test_attention.py.
Every weight is set from a seeded numpy generator named by the weight's path, so every
backend holds the same numbers. `run(name)` returns the case's outputs as float64 arrays
by name; `run(name, jit=True)` (JAX) runs each call under `jax.jit`, the cache, its update
index and mask traced.

Kinds of case:
- "plain": one call, no cache (`query`, optional `value` / `key` shapes, call arguments);
- "cached": a prefill and decode steps (`splits`: the tokens of each call) into a cache of
  `MAX_LENGTH` slots, optional left `padding` per row (a `cache_mask`) and explicit
  `positions`;
- "decoder": `decoder_models` of a `DecoderBlock`: the step model's prefill (left padded)
  and decode steps, and the training model.
"""

from __future__ import annotations

import zlib

import numpy as np
from cases import DYNAMIC, LLAMA3, YARN, grid

WIDTH = 32
TEMPERATURE = {"floor_scale": 3, "attn_scale": 0.5}


def _left_padded(pads, length: int) -> np.ndarray:
    return (np.arange(length)[None, :] >= np.asarray(pads)[:, None]).astype(np.int32)


def _random_mask(seed: int, shape) -> np.ndarray:
    mask = np.random.default_rng(seed).random(shape) < 0.7
    mask[..., np.arange(shape[-2]), np.arange(shape[-2])] = True  # never a row of nothing
    return mask


MHA, GQA = "RotaryMultiHeadAttention", "RotaryGroupQueryAttention"
# The cases share their shapes where they can (8 tokens, 4 heads of 8, 2 key/value heads,
# a cache of 12 slots, prefill 5): JAX compiles each eager op once per shape.
LENGTH, MAX_LENGTH = 8, 12
HEADS = {"num_heads": 4, "key_dim": 8}
GROUPS = {"head_dim": 8, "num_query_heads": 4, "num_key_value_heads": 2}
# longrope for 4 channel pairs, switching to its long factors past 8 positions.
LONGROPE = {
    "rope_type": "longrope",
    "original_max_position_embeddings": 8,
    "factor": 4.0,
    "short_factor": [1.0, 1.1, 1.3, 1.5],
    "long_factor": [1.0, 2.0, 4.0, 6.0],
}
QUERY = (2, LENGTH, WIDTH)
CAUSAL = {"use_causal_mask": True}

# name: the case (see the module docstring)
CASES = {
    "mha_causal_partial": {
        "kind": "plain",
        "layer": MHA,
        "arguments": {**HEADS, "rope_layout": "interleaved", "rope_dim": 4},
        "query": QUERY,
        "call": CAUSAL,
    },
    "mha_cross_masks_positions_scores": {
        "kind": "plain",
        "layer": MHA,
        "arguments": {**HEADS, "value_dim": 6},
        "query": QUERY,
        "value": (2, LENGTH, 24),
        "key": (2, LENGTH, 16),
        "call": {
            "query_mask": _left_padded([0, 2], LENGTH),
            "value_mask": _left_padded([3, 0], LENGTH),
            "key_mask": np.arange(LENGTH)[None, :] != np.array([[5], [1]]),
            "query_positions": np.array(
                [[4, 5, 6, 7, 8, 9, 10, 11], [0, 0, 1, 2, 3, 4, 5, 30]], np.int32
            ),
            "key_positions": np.arange(3, 3 + LENGTH, dtype=np.int32),
            "return_attention_scores": True,
        },
    },
    "mha_dynamic_start_attention_mask": {
        "kind": "plain",
        "layer": MHA,
        "arguments": {**HEADS, "rope_scaling": DYNAMIC},  # past its 32 positions
        "query": QUERY,
        "call": {
            "query_start_index": 30,
            "key_start_index": 30,
            "attention_mask": _random_mask(7, (2, LENGTH, LENGTH)),
        },
    },
    "mha_window_gate_linear": {
        "kind": "plain",
        "layer": MHA,
        "arguments": {
            **HEADS,
            "sliding_window": 3,
            "use_gate": True,
            "rope_scaling": {"rope_type": "linear", "factor": 2.0},
        },
        "query": QUERY,
        "call": CAUSAL,
    },
    "gqa_padded_chunked_tempered_l2": {
        "kind": "plain",
        "layer": GQA,
        "arguments": {
            **GROUPS,
            "positions_from_mask": True,
            "attention_chunk_size": 3,
            "query_temperature": TEMPERATURE,
            "query_key_norm": "l2_after_rope",
        },
        "query": QUERY,
        "call": {
            "query_mask": _left_padded([0, 3], LENGTH),
            "value_mask": _left_padded([0, 3], LENGTH),
            **CAUSAL,
        },
    },
    "gqa_rms_per_head_yarn": {
        "kind": "plain",
        "layer": GQA,
        "arguments": {**GROUPS, "query_key_norm": "rms_per_head", "rope_scaling": YARN},
        "query": QUERY,
        "call": {**CAUSAL, "query_start_index": 60, "key_start_index": 60},
    },
    "mqa_gemma_norm_llama3": {
        "kind": "plain",
        "layer": GQA,
        "arguments": {
            **GROUPS,
            "num_key_value_heads": 1,
            "query_key_norm": "gemma_rms_per_head",
            "rope_scaling": LLAMA3,
        },
        "query": QUERY,
        "call": {**CAUSAL, "query_start_index": 100, "key_start_index": 100},
    },
    "gqa_across_heads_longrope": {
        "kind": "plain",
        "layer": GQA,
        "arguments": {**GROUPS, "query_key_norm": "rms_across_heads", "rope_scaling": LONGROPE},
        "query": QUERY,
        "call": {**CAUSAL, "query_start_index": 6, "key_start_index": 6},
    },
    "gqa_after_rope_norm": {
        "kind": "plain",
        "layer": GQA,
        "arguments": {**GROUPS, "query_key_norm": "rms_per_head_after_rope"},
        "query": QUERY,
        "call": CAUSAL,
    },
    "mha_axial": {
        "kind": "plain",
        "layer": MHA,
        "arguments": {**HEADS, "rope_axes_dims": (4, 4)},
        "query": QUERY,
        "call": {"query_positions": grid(2, 4), "key_positions": grid(2, 4)},
    },
    "gqa_mrope_interleaved": {
        "kind": "plain",
        "layer": GQA,
        "arguments": {**GROUPS, "rope_mrope_section": (1, 1, 2), "rope_mrope_interleaved": True},
        "query": QUERY,
        "call": {
            **CAUSAL,
            "query_positions": np.random.default_rng(3).integers(0, 40, (2, LENGTH, 3), np.int32),
            "key_positions": np.random.default_rng(3).integers(0, 40, (2, LENGTH, 3), np.int32),
        },
    },
    "gqa_bfloat16": {
        "kind": "plain",
        "layer": GQA,
        "arguments": {**GROUPS, "dtype": "mixed_bfloat16"},
        "query": QUERY,
        "call": {**CAUSAL, "query_start_index": 3, "key_start_index": 3},
    },
    "mha_float16_scores": {
        "kind": "plain",
        "layer": MHA,
        "arguments": {**HEADS, "dtype": "mixed_float16"},
        "query": QUERY,
        "call": {**CAUSAL, "return_attention_scores": True},
    },
    # With a cache: a prefill, then decode steps.
    "gqa_cache_left_padded": {
        "kind": "cached",
        "layer": GQA,
        "arguments": {**GROUPS, "positions_from_mask": True, "rope_layout": "interleaved"},
        "splits": (5, 1, 1, 1),
        "padding": (0, 3),
    },
    "mha_cache_window_gate_yarn_gemma_norm": {
        "kind": "cached",
        "layer": MHA,
        "arguments": {
            **HEADS,
            "sliding_window": 4,
            "use_gate": True,
            "rope_scaling": YARN,
            "query_key_norm": "gemma_rms_per_head",
        },
        "splits": (5, 2, 1),
    },
    "gqa_cache_chunked_tempered": {
        "kind": "cached",
        "layer": GQA,
        "arguments": {
            **GROUPS,
            "positions_from_mask": True,
            "attention_chunk_size": 3,
            "query_temperature": TEMPERATURE,
            "query_key_norm": "rms_across_heads",
        },
        "splits": (5, 1, 1, 1),
        "padding": (2, 0),
    },
    "gqa_cache_longrope_switch_window_gate": {
        "kind": "cached",
        "layer": GQA,
        "arguments": {
            **GROUPS,
            "rope_scaling": LONGROPE,
            "query_key_norm": "rms_per_head",
            "sliding_window": 4,
            "use_gate": True,
        },
        "splits": (5, 1, 1, 1, 1, 1),  # past 8 positions: the long factors
    },
    "gqa_cache_mrope_bfloat16": {
        "kind": "cached",
        "layer": GQA,
        "arguments": {**GROUPS, "rope_mrope_section": (1, 1, 2), "dtype": "mixed_bfloat16"},
        "splits": (5, 1, 1, 1),
        "positions": np.random.default_rng(4).integers(0, 30, (2, LENGTH, 3), np.int32),
    },
    "decoder": {"kind": "decoder", "splits": (5, 1, 1, 1), "padding": (0, 2)},
}

VOCABULARY = 32
# Layers are made with zeros, then given their weights (`set_weights`): on JAX a random
# initializer compiles for every weight shape, costing more than the case itself.
ZEROS = {"kernel_initializer": "zeros", "bias_initializer": "zeros"}


def _seeded(path: str):
    return np.random.default_rng(zlib.crc32(path.encode()))


def set_weights(layer) -> None:
    """Every weight of `layer` from a generator seeded by its path: the same on every backend.

    Kernels are unit normal times 0.4 (attention far from uniform: a wrong position or
    mask shows), biases 0.1, norm scales `1 + 0.2 n`, embeddings unit normal.
    """
    for weight in layer.weights:
        normal = _seeded(weight.path).standard_normal(tuple(weight.shape))
        name = weight.path.rsplit("/", 1)[-1]
        if name == "scale":
            value = 1.0 + 0.2 * normal
        elif name == "bias":
            value = 0.1 * normal
        elif name == "embeddings":
            value = normal
        else:
            value = 0.4 * normal
        weight.assign(value.astype(np.float32))


def tokens(name: str, shape, dtype: str = "") -> np.ndarray:
    """A case's float32 input; for a mixed policy, values its compute dtype holds exactly."""
    x = _seeded(f"{name}{shape}").standard_normal(shape).astype(np.float32)
    if dtype.endswith("float16"):
        import ml_dtypes

        narrow = ml_dtypes.bfloat16 if dtype.endswith("bfloat16") else np.float16
        x = x.astype(narrow).astype(np.float32)
    return x


def build(name: str):
    """The case's attention layer, built, its weights set."""
    import keras_posenc

    case = CASES[name]
    layer = getattr(keras_posenc, case["layer"])(**case["arguments"], **ZEROS, name="attention")
    if case["kind"] == "plain":
        query = case["query"]
        layer.build(query, case.get("value", query), case.get("key"))
    else:
        shape = (2, sum(case["splits"]), WIDTH)
        layer.build(shape, shape)
    set_weights(layer)
    return layer


def cache_shape(name: str, layer) -> tuple:
    heads, kv_heads, head_dim, _ = layer._head_counts()
    return (2, 2, MAX_LENGTH, kv_heads, head_dim)


def cache_mask(name: str):
    case = CASES[name]
    if case.get("padding") is None:
        return None
    return _left_padded(case["padding"], MAX_LENGTH)


def padding_queries(name: str, steps: int) -> np.ndarray:
    """`(batch, steps)` bools: the queries that are padding tokens (a `query_mask`'s zeros,
    a cached or decoder case's left padding), which attend to no key.

    What such a query's output is, no formula says: TensorFlow, JAX and torch's CPU kernel
    average the values; torch's CUDA kernels give other finite numbers (measured on an
    H200, docs/gpu.md). The comparisons leave these rows out, and only hold them finite.
    """
    case = CASES[name]
    if case["kind"] == "plain":
        query_mask = case["call"].get("query_mask")
        if query_mask is None:
            return np.zeros((QUERY[0], steps), bool)
        return np.asarray(query_mask) == 0
    return _left_padded(case.get("padding") or (0, 0), steps) == 0


def _numpy(x) -> np.ndarray:
    import keras

    return keras.ops.convert_to_numpy(keras.ops.cast(x, "float32")).astype(np.float64)


def run(name: str, jit: bool = False) -> dict:
    """The case's outputs by name, as float64 (see the module docstring). With `jit`, also
    `"compilations"`: how many times `jax.jit` compiled the cached call."""
    kind = CASES[name]["kind"]
    if kind == "plain":
        return _run_plain(name, jit)
    if kind == "cached":
        return _run_cached(name, jit)
    return _run_decoder(name, jit)


def _run_plain(name: str, jit: bool) -> dict:
    case = CASES[name]
    layer = build(name)
    dtype = case["arguments"].get("dtype", "")
    query = tokens(name, case["query"], dtype)
    value = None if "value" not in case else tokens(name, case["value"], dtype)
    key = None if "key" not in case else tokens(name, case["key"], dtype)

    def call(query, value, key, arguments):
        value = query if value is None else value  # self-attention: the same tensor
        return layer(query, value, key=key, **arguments)

    if jit:
        import jax

        # Arrays and start indices traced; the flags (causal mask, scores) static.
        traced = {k: v for k, v in case["call"].items() if not isinstance(v, bool)}
        static = {k: v for k, v in case["call"].items() if isinstance(v, bool)}
        outputs = jax.jit(lambda q, v, k, a: call(q, v, k, {**a, **static}))(
            query, value, key, traced
        )
    else:
        outputs = call(query, value, key, case["call"])
    if case["call"].get("return_attention_scores"):
        return {"output": _numpy(outputs[0]), "scores": _numpy(outputs[1])}
    return {"output": _numpy(outputs)}


def _run_cached(name: str, jit: bool) -> dict:
    case = CASES[name]
    layer = build(name)
    total = sum(case["splits"])
    x = tokens(name, (2, total, WIDTH), case["arguments"].get("dtype", ""))
    mask, positions = cache_mask(name), case.get("positions")

    def step(x, cache, index, mask, positions):
        extra = {} if mask is None else {"cache_mask": mask}
        if positions is not None:
            extra["query_positions"] = positions
        return layer(x, x, use_causal_mask=True, cache=cache, cache_update_index=index, **extra)

    if jit:
        import jax

        step = jax.jit(step)
    cache = np.zeros(cache_shape(name, layer), np.float32)
    outputs, index = [], 0
    for size in case["splits"]:
        step_positions = None if positions is None else positions[:, index : index + size]
        output, cache = step(
            x[:, index : index + size], cache, np.int32(index), mask, step_positions
        )
        outputs.append(_numpy(output))
        index += size
    results = {"output": np.concatenate(outputs, 1), "cache": _numpy(cache)}
    if jit:
        results["compilations"] = step._cache_size()
    return results


def decoder(max_length: int):
    """`(training model, step model)` of a `DecoderBlock` (one: JAX compiles every eager op
    of each), weights set."""
    import keras

    import keras_posenc as kp

    blocks = [
        kp.DecoderBlock(
            8, 4, 2, 64, query_key_norm="rms_per_head", kernel_initializer="zeros", name="block_0"
        )
    ]
    train, step = kp.decoder_models(
        keras.layers.Embedding(VOCABULARY, WIDTH, embeddings_initializer="zeros", name="embedding"),
        blocks,
        keras.layers.RMSNormalization(name="final_norm"),
        keras.layers.Dense(VOCABULARY, use_bias=False, kernel_initializer="zeros", name="head"),
        max_length=max_length,
    )
    set_weights(step)
    return train, step


def token_ids(name: str) -> np.ndarray:
    case = CASES[name]
    ids = _seeded(name).integers(1, VOCABULARY, (2, sum(case["splits"]))).astype(np.int32)
    prompt = case["splits"][0]
    ids[:, :prompt][_left_padded(case["padding"], prompt) == 0] = 0
    return ids


def _run_decoder(name: str, jit: bool) -> dict:
    import keras

    case = CASES[name]
    train, step = decoder(MAX_LENGTH)
    ids = token_ids(name)
    padding = _left_padded(case["padding"], MAX_LENGTH)
    call = step
    if jit:
        import jax

        call = jax.jit(lambda inputs: step(inputs))
    cache = np.zeros((2, 1, 2, MAX_LENGTH, 2, 8), np.float32)
    logits, index = [], 0
    for size in case["splits"]:
        feeds = {
            "token_ids": ids[:, index : index + size],
            "cache": cache,
            "cache_update_index": np.int32(index),
            "padding_mask": padding,
        }
        # A functional model takes tensors (not tensors and numpy arrays mixed).
        out = call({key: keras.ops.convert_to_tensor(value) for key, value in feeds.items()})
        logits.append(_numpy(out["logits"]))
        cache = out["next_cache"]
        index += size
    results = {"logits": np.concatenate(logits, 1), "cache": _numpy(cache)}
    if jit:
        results["compilations"] = call._cache_size()
    else:  # the training model (under jit it is what `fit` compiles: see test_attention)
        results["train_logits"] = _numpy(train(ids[:, : case["splits"][0]]))
    return results
