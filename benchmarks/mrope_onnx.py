"""`python -m benchmarks.mrope_onnx`: M-RoPE in onnxruntime, our exports against its kernel.

At a Qwen2-VL-like shape, (1, 1024, 16, 128) with `mrope_section=(16, 24, 24)` and the
positions of 64 text tokens and a 30 x 32 image (`multimodal_positions`), chunked and
interleaved sections, one process, every candidate interleaved in a random order per
round (`benchmarks.onnxruntime.run_rounds`, CPU time, one onnxruntime thread):

- `kernel`: a one-node `com.microsoft.MRotaryEmbedding` graph (4096-row caches, position
  ids `(3, batch, sequence)` int64 as the kernel takes them);
- `fused` / `decomposed`: `save_onnx(rotary=...)` of `RotaryEmbedding(mrope_section=...)`
  with positions `(batch, sequence, 3)`;
- `1d fused` / `1d decomposed` / `1d kernel`: the plain 1D RoPE export with positions
  `(batch, sequence)` and the one-node `com.microsoft.RotaryEmbedding` (what the rows of
  three axes cost over one).

Each output is also compared with the float64 Qwen2-VL formula (max abs error).

Example:

    python -m benchmarks.mrope_onnx                # about a minute on 2 cores
    python -m benchmarks.mrope_onnx --seconds 20
"""

from __future__ import annotations

import os

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import argparse  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402

import keras  # noqa: E402
import numpy as np  # noqa: E402
import onnx  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from benchmarks import onnxruntime as bench  # noqa: E402
from keras_posenc import RotaryEmbedding, export, multimodal_positions  # noqa: E402
from keras_posenc.frequencies import CACHED_POSITIONS, inverse_frequencies  # noqa: E402

SHAPE = (1, 1024, 16, 128)
SECTION = (16, 24, 24)
SEGMENTS = [("text", 64), ("image", (1, 30, 32))]  # 64 + 960 = 1024 tokens


def kernel_graph(interleaved: bool) -> onnx.ModelProto:
    """The one-node `com.microsoft.MRotaryEmbedding` on (batch, sequence, heads·dim)."""
    _, _, heads, dim = SHAPE
    angles = np.multiply.outer(
        np.arange(CACHED_POSITIONS, dtype=np.float64), inverse_frequencies(dim)
    )
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Reshape", ["x", "flat"], ["x3"]),
        helper.make_node(
            "MRotaryEmbedding",
            ["x3", "position_ids", "cos", "sin"],
            ["y3"],
            domain="com.microsoft",
            mrope_section=list(SECTION),
            mrope_layout=int(interleaved),
            num_heads=heads,
        ),
        helper.make_node("Reshape", ["y3", "shape"], ["y"]),
    ]
    initializers = [
        numpy_helper.from_array(np.cos(angles).astype(np.float32), "cos"),
        numpy_helper.from_array(np.sin(angles).astype(np.float32), "sin"),
        numpy_helper.from_array(np.array([0, 0, -1], np.int64), "flat"),
    ]
    inputs = [
        helper.make_tensor_value_info("x", TensorProto.FLOAT, None),
        helper.make_tensor_value_info("position_ids", TensorProto.INT64, [3, None, None]),
    ]
    return bench._model(nodes, inputs, initializers, domains=("com.microsoft",))


def rope_model(axes: int, **layer_kwargs) -> keras.Model:
    x = keras.Input(SHAPE[1:], name="x")
    positions = keras.Input((None, axes) if axes > 1 else (None,), dtype="int32", name="positions")
    return keras.Model([x, positions], RotaryEmbedding(**layer_kwargs)(x, positions=positions))


def reference(x: np.ndarray, positions: np.ndarray, interleaved: bool) -> np.ndarray:
    """Qwen2-VL's `apply_multimodal_rotary_pos_emb` (Qwen3-VL's interleaving), float64."""
    dim = SHAPE[-1]
    omega = 1.0 / 10000.0 ** (np.arange(0, dim, 2, dtype=np.float64) / dim)
    freqs = np.moveaxis(positions.astype(np.float64), -1, 0)[..., None] * omega
    if interleaved:
        angles = freqs[0].copy()
        for axis in (1, 2):
            angles[..., axis : 3 * SECTION[axis] : 3] = freqs[
                axis, ..., axis : 3 * SECTION[axis] : 3
            ]
    else:
        chunks = np.split(freqs, np.cumsum(SECTION)[:-1], axis=-1)
        angles = np.concatenate([chunk[i] for i, chunk in enumerate(chunks)], -1)
    cos, sin = np.cos(angles)[:, :, None], np.sin(angles)[:, :, None]
    a, b = np.split(x.astype(np.float64), 2, -1)
    return np.concatenate([a * cos - b * sin, b * cos + a * sin], -1)


def cases(folder: Path) -> tuple[dict, dict]:
    """`({case: {candidate: call}}, {case: {candidate: max abs error vs float64}})`."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal(SHAPE).astype(np.float32)
    positions = multimodal_positions(SEGMENTS)[None]  # (1, 1024, 3)
    text = np.arange(SHAPE[1], dtype=np.int32)[None]
    all_cases, errors = {}, {}
    for interleaved in (False, True):
        case = f"mrope {'interleaved' if interleaved else 'chunked'}"
        model = rope_model(3, mrope_section=SECTION, mrope_interleaved=interleaved)
        feeds = {"x": x, "positions": positions}
        candidates = {
            "kernel": (
                kernel_graph(interleaved),
                {"x": x, "position_ids": np.moveaxis(positions, -1, 0).astype(np.int64)},
                reference(x, positions, interleaved),
            )
        }
        for form in ("fused", "decomposed"):
            path = export.save_onnx(
                model, folder / f"{case}_{form}.onnx".replace(" ", "_"), rotary=form
            )
            candidates[form] = (onnx.load(str(path)), feeds, reference(x, positions, interleaved))
        plain = rope_model(1)
        text3 = np.repeat(text[..., None], 3, -1)
        for form in ("fused", "decomposed"):
            path = export.save_onnx(plain, folder / f"1d_{interleaved}_{form}.onnx", rotary=form)
            candidates[f"1d {form}"] = (
                onnx.load(str(path)),
                {"x": x, "positions": text},
                reference(x, text3, interleaved),
            )
        candidates["1d kernel"] = (
            bench.kernel_graph(SHAPE[-1]),
            {"x": x, "start": np.zeros(1, np.int64)},
            reference(x, text3, interleaved),
        )
        all_cases[case], errors[case] = {}, {}
        for name, (proto, candidate_feeds, expected) in candidates.items():
            run = bench.session(proto).run
            errors[case][name] = float(np.abs(run(None, candidate_feeds)[0] - expected).max())
            all_cases[case][name] = lambda run=run, feeds=candidate_feeds: run(None, feeds)
    return all_cases, errors


RATIOS = [
    ("fused", "kernel"),
    ("decomposed", "kernel"),
    ("fused", "1d fused"),
    ("decomposed", "1d decomposed"),
    ("kernel", "1d kernel"),
    ("1d fused", "1d kernel"),
]


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=40.0, help="time for the timed rounds")
    parser.add_argument("--max-rounds", type=int, default=41)
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as folder:
        all_cases, errors = cases(Path(folder))
        samples = bench.run_rounds(all_cases, args.seconds, args.max_rounds)
    results = {}
    lines = [
        "| case | candidate | ms | vs | ms | ratio | max abs error vs float64 |",
        "|---|---|---:|---|---:|---:|---:|",
    ]
    for case, times in samples.items():
        medians = {name: 1e3 * statistics.median(s) for name, s in times.items()}
        results[case] = {"median_ms": medians, "max_abs_error": errors[case], "ratios": {}}
        for numerator, denominator in RATIOS:
            paired = [a / b for a, b in zip(times[numerator], times[denominator], strict=True)]
            ratio = statistics.median(paired)
            results[case]["ratios"][f"{numerator} / {denominator}"] = ratio
            lines.append(
                f"| {case} | {numerator} | {medians[numerator]:.3f} | {denominator} | "
                f"{medians[denominator]:.3f} | {ratio:.2f} | {errors[case][numerator]:.1e} |"
            )
    print("\n".join(lines))
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2))
    return results


if __name__ == "__main__":
    main()
