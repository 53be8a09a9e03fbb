"""Dynamic NTK cases past the switch, up to position 2^20, and their float64 formula.

Shared by tests/test_dynamic_ntk_exact.py (TensorFlow) and test_dynamic_ntk.py (JAX,
PyTorch). The reference is transformers' definition (`modeling_rope_utils.
_compute_dynamic_ntk_parameters`): base `θ·(factor·L/M - (factor - 1))^(d/(d-2))` for a total
length `L > M`, `ω_k = base^(-2k/d)`, computed here in float64.
"""

from __future__ import annotations

import numpy as np

SMALL = {"rope_type": "dynamic", "factor": 2.0, "max_position_embeddings": 32}
LLAMA = {"rope_type": "dynamic", "factor": 8.0, "max_position_embeddings": 2048}

CASES = {
    "start_1000": {"scaling": SMALL, "dim": 64, "start": 1000, "length": 8},
    "start_2^20": {"scaling": SMALL, "dim": 64, "start": 2**20 - 8, "length": 8},
    "llama_start_2^20": {"scaling": LLAMA, "dim": 128, "start": 2**20 - 6, "length": 6},
    "positions": {
        "scaling": SMALL,
        "dim": 64,
        "positions": np.array([0, 7, 999, 65_537, 777_777, 2**20 - 1], np.int32),
    },
    "llama_positions": {
        "scaling": LLAMA,
        "dim": 128,
        "positions": np.array([5, 2049, 123_456, 524_287, 1_000_003], np.int32),
    },
}


def positions_of(case: dict) -> np.ndarray:
    if "positions" in case:
        return case["positions"]
    return np.arange(case["start"], case["start"] + case["length"])


def inputs(case: dict) -> np.ndarray:
    """`(1, sequence, 2 heads, dim)` values in [-1, 1]."""
    shape = (1, len(positions_of(case)), 2, case["dim"])
    return np.random.default_rng(case["dim"]).uniform(-1, 1, shape).astype(np.float32)


def reference(case: dict) -> np.ndarray:
    """The float64 rotation (half layout) of `inputs(case)` at its positions."""
    x = inputs(case).astype(np.float64)
    dim, positions = case["dim"], positions_of(case).astype(np.float64)
    factor = case["scaling"]["factor"]
    original = case["scaling"]["max_position_embeddings"]
    total = max(positions.max() + 1, original)
    base = 10000.0 * (factor * total / original - (factor - 1)) ** (dim / (dim - 2))
    inverse = 1.0 / base ** (np.arange(0, dim, 2, dtype=np.float64) / dim)
    angles = positions[:, None] * inverse
    cos = np.concatenate([np.cos(angles)] * 2, -1)[None, :, None, :]
    sin = np.concatenate([np.sin(angles)] * 2, -1)[None, :, None, :]
    half = dim // 2
    return x * cos + np.concatenate([-x[..., half:], x[..., :half]], -1) * sin
