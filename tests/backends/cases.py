"""The encoder-layer cases run on every backend: one definition, run under TensorFlow by
tests/test_backends.py (its results the subprocesses compare with) and under JAX / torch by
tests/backends/test_encoders.py.

A case is a layer, an input and the call arguments; `run(case)` builds the layer on the
backend Keras runs, gives a learned table fixed weights, and returns the float64 output.
"""

from __future__ import annotations

import math

import numpy as np

LONGROPE_PAIRS = 8  # rotary_dim 16
LONGROPE = {
    "rope_type": "longrope",
    "original_max_position_embeddings": 16,
    "factor": 4.0,
    "short_factor": list(np.linspace(1.0, 1.5, LONGROPE_PAIRS)),
    "long_factor": list(np.linspace(1.0, 6.0, LONGROPE_PAIRS)),
}
DYNAMIC = {"rope_type": "dynamic", "factor": 2.0, "max_position_embeddings": 32}
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}
LLAMA3 = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 64,
}


def _positions(seed: int, shape, high: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, high, size=shape).astype(np.int32)


def grid(height: int, width: int) -> np.ndarray:
    return (
        np.stack(np.meshgrid(np.arange(height), np.arange(width), indexing="ij"), -1)
        .reshape(-1, 2)
        .astype(np.int32)
    )


# name: (layer class, layer arguments, input shape, call arguments)
CASES = {
    "sinusoidal_run": ("SinusoidalPositionalEncoding", {}, (2, 12, 64), {}),
    "sinusoidal_start": ("SinusoidalPositionalEncoding", {}, (2, 12, 64), {"start_index": 9}),
    "sinusoidal_past_cache": (
        "SinusoidalPositionalEncoding",
        {},
        (2, 12, 64),
        {"start_index": 4090},
    ),
    # A run across a coarse row of the split tables, and the last positions of all.
    "sinusoidal_coarse_boundary": (
        "SinusoidalPositionalEncoding",
        {},
        (2, 12, 64),
        {"start_index": 3 * 4096 - 5},
    ),
    "rotary_last_positions": ("RotaryEmbedding", {}, (2, 12, 2, 16), {"start_index": 2**24 - 12}),
    # Runs of more row values than `keras_ops_backend.rows.SMALL_RUN_VALUES`: a conditional under
    # jit.
    "sinusoidal_long_run": (
        "SinusoidalPositionalEncoding",
        {},
        (1, 80, 64),
        {"start_index": 4090},
    ),
    "rotary_long_run": ("RotaryEmbedding", {}, (1, 80, 1, 64), {"start_index": 2 * 4096 - 40}),
    "sinusoidal_positions": (
        "SinusoidalPositionalEncoding",
        {},
        (2, 12, 64),
        {"positions": _positions(1, (2, 12), 2_000_000)},
    ),
    "sinusoidal_t2t": (
        "SinusoidalPositionalEncoding",
        {"layout": "concat", "frequency_spacing": "tensor2tensor"},
        (2, 12, 32),
        {"start_index": 3},
    ),
    "sinusoidal_axes": (
        "SinusoidalPositionalEncoding",
        {"axes": 2},
        (2, 12, 32),
        {"positions": grid(3, 4)},
    ),
    "learned_start": (
        "LearnedPositionalEmbedding",
        {"max_length": 40},
        (2, 12, 16),
        {"start_index": 5},
    ),
    "learned_positions": (
        "LearnedPositionalEmbedding",
        {"max_length": 40},
        (2, 12, 16),
        {"positions": _positions(2, (2, 12), 40)},
    ),
    "rotary_run": ("RotaryEmbedding", {}, (2, 12, 4, 32), {}),
    "rotary_start": ("RotaryEmbedding", {}, (2, 12, 4, 32), {"start_index": 7000}),
    "rotary_interleaved_partial": (
        "RotaryEmbedding",
        {"layout": "interleaved", "rotary_dim": 16},
        (2, 12, 2, 32),
        {"positions": _positions(3, (12,), 300_000)},
    ),
    "rotary_heads_first": (
        "RotaryEmbedding",
        {"sequence_axis": 2},
        (2, 3, 12, 16),
        {"start_index": 2},
    ),
    "rotary_linear": (
        "RotaryEmbedding",
        {"scaling": {"rope_type": "linear", "factor": 4.0}},
        (2, 12, 2, 16),
        {"start_index": 11},
    ),
    "rotary_yarn": ("RotaryEmbedding", {"scaling": YARN}, (2, 12, 2, 16), {"start_index": 50}),
    "rotary_llama3": ("RotaryEmbedding", {"scaling": LLAMA3}, (2, 12, 2, 16), {}),
    "rotary_dynamic_short": ("RotaryEmbedding", {"scaling": DYNAMIC}, (2, 12, 2, 16), {}),
    "rotary_dynamic_long": (
        "RotaryEmbedding",
        {"scaling": DYNAMIC},
        (2, 12, 2, 16),
        {"start_index": 36},
    ),
    "rotary_longrope_short": ("RotaryEmbedding", {"scaling": LONGROPE}, (2, 12, 2, 16), {}),
    "rotary_longrope_long": (
        "RotaryEmbedding",
        {"scaling": LONGROPE},
        (2, 12, 2, 16),
        {"start_index": 10},
    ),
    "rotary_mask": (
        "RotaryEmbedding",
        {"positions_from_mask": True},
        (2, 12, 2, 16),
        {"mask": np.arange(12)[None, :] >= np.array([[0], [3]])},
    ),
    "rotary_axial": (
        "RotaryEmbedding",
        {"axes_dims": (16, 16)},
        (2, 12, 2, 32),
        {"positions": grid(3, 4)},
    ),
    "rotary_mrope": (
        "RotaryEmbedding",
        {"mrope_section": (2, 3, 3)},
        (2, 12, 2, 16),
        {"positions": np.stack([_positions(4, (12,), 50)] * 3, -1)},
    ),
    "rotary_bfloat16": (
        "RotaryEmbedding",
        {"dtype": "mixed_bfloat16"},
        (2, 12, 2, 32),
        {"start_index": 100},
    ),
    "sinusoidal_float16": (
        "SinusoidalPositionalEncoding",
        {"dtype": "mixed_float16"},
        (2, 12, 64),
        {"start_index": 100},
    ),
}


def inputs(name: str) -> np.ndarray:
    """The case's float32 input; for a mixed policy, values its compute dtype holds exactly."""
    shape, dtype = CASES[name][2], CASES[name][1].get("dtype", "")
    seed = sum(map(ord, name))
    x = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    if dtype.endswith("float16"):
        import ml_dtypes

        narrow = ml_dtypes.bfloat16 if dtype.endswith("bfloat16") else np.float16
        x = x.astype(narrow).astype(np.float32)
    return x


def learned_table(max_length: int, width: int) -> np.ndarray:
    return np.random.default_rng(max_length).standard_normal((max_length, width)).astype(np.float32)


def build(name: str):
    """The case's layer, built for its input (a learned table given fixed weights)."""
    import keras_posenc

    class_name, arguments, shape, _ = CASES[name]
    layer = getattr(keras_posenc, class_name)(**arguments)
    layer.build(shape)
    if class_name == "LearnedPositionalEmbedding":
        layer.embeddings.assign(learned_table(arguments["max_length"], shape[-1]))
    return layer


def run(name: str) -> np.ndarray:
    """The case's output, eagerly, as float64."""
    import keras

    layer = build(name)
    x = keras.ops.cast(inputs(name), layer.compute_dtype)
    output = layer(x, **CASES[name][3])
    return keras.ops.convert_to_numpy(keras.ops.cast(output, "float32")).astype(np.float64)


def dynamic_base(total_length: int, dim: int, base: float = 10000.0) -> float:
    """Dynamic NTK's base for a total length (transformers' formula), float64."""
    factor, original = DYNAMIC["factor"], DYNAMIC["max_position_embeddings"]
    length = max(total_length, original)
    return base * (factor * length / original - (factor - 1)) ** (dim / (dim - 2))


def longrope_factor() -> float:
    """longrope's attention factor `sqrt(1 + ln f / ln L0)`."""
    original = LONGROPE["original_max_position_embeddings"]
    return math.sqrt(1 + math.log(LONGROPE["factor"]) / math.log(original))
