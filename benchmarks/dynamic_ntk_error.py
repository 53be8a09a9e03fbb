"""Dynamic NTK RoPE past its switch: each backend's error against the float64 formula.

    python -m benchmarks.dynamic_ntk_error

Dynamic NTK's frequencies depend on the total length, known at run time only. The layers
hold them as two float32 words (`keras_posenc.rope.dynamic_ntk`: the host's float64 where the
length is known, error-free float32 arithmetic in graphs), and `exact_sin_cos` turns them
into angles without rounding the product, so the error no longer grows with the position
(formed in float32, as transformers does, it was 7e-2 at 2^20). This prints, per start, the
largest difference of each backend's output from the float64 formula and from TensorFlow's.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

import numpy as np

STARTS = (40, 1000, 5000, 100_000, 2**24 - 64)
SHAPE = (1, 64, 2, 64)  # batch, sequence, heads, head_dim
SCALING = {"rope_type": "dynamic", "factor": 2.0, "max_position_embeddings": 32}


def _inputs() -> np.ndarray:
    return np.random.default_rng(0).standard_normal(SHAPE).astype(np.float32)


def _outputs(path: str) -> None:
    """In a process of one backend: the layer's outputs at every start, saved to `path`."""
    import keras

    import keras_posenc as kp

    layer = kp.RotaryEmbedding(layout="half", scaling=SCALING)
    outputs = [layer(_inputs(), start_index=start) for start in STARTS]
    np.save(path, np.stack([keras.ops.convert_to_numpy(o) for o in outputs]))


def _reference(start: int) -> np.ndarray:
    """The float64 formula (transformers' dynamic NTK base; RoPE's half layout)."""
    x = _inputs().astype(np.float64)
    dim, total = SHAPE[-1], start + SHAPE[1]
    factor, original = SCALING["factor"], SCALING["max_position_embeddings"]
    base = 10000.0 * (factor * max(total, original) / original - (factor - 1)) ** (dim / (dim - 2))
    angles = np.arange(start, total)[:, None] * base ** (-np.arange(0, dim, 2) / dim)
    cos = np.concatenate([np.cos(angles)] * 2, -1)[None, :, None, :]
    sin = np.concatenate([np.sin(angles)] * 2, -1)[None, :, None, :]
    half = dim // 2
    return x * cos + np.concatenate([-x[..., half:], x[..., :half]], -1) * sin


def main() -> None:
    backends = ["tensorflow", "jax", "torch"]
    results = {}
    with tempfile.TemporaryDirectory() as folder:
        for backend in backends:
            path = os.path.join(folder, f"{backend}.npy")
            environment = {**os.environ, "KERAS_BACKEND": backend, "TF_CPP_MIN_LOG_LEVEL": "3"}
            code = f"from benchmarks.dynamic_ntk_error import _outputs; _outputs({path!r})"
            subprocess.run([sys.executable, "-c", code], env=environment, check=True)
            results[backend] = np.load(path)
    print("Command: `python -m benchmarks.dynamic_ntk_error`. Largest |difference| on inputs")
    print(f"of shape {SHAPE} (standard normal), dynamic NTK factor 2 from 32 positions.\n")
    columns = [f"{b} - float64" for b in backends] + ["jax - tf", "torch - tf"]
    print("| start | " + " | ".join(columns) + " |")
    print("|--:|" + "--:|" * (len(backends) + 2))
    for i, start in enumerate(STARTS):
        reference = _reference(start)
        cells = [np.abs(results[b][i] - reference).max() for b in backends]
        cells += [np.abs(results[b][i] - results["tensorflow"][i]).max() for b in backends[1:]]
        print(f"| {start} | " + " | ".join(f"{c:.1e}" for c in cells) + " |")


if __name__ == "__main__":
    main()
