"""Bad positions in exported files: NaN rows or an error that names the input, never plausible.

tf2onnx and the LiteRT converter drop TensorFlow's assertions, and their slices and
gathers clamp or wrap indices out of range, so a file could answer a negative start or a
position past the table with the rows of another position. For each runtime and each
layer kind, every row at a bad position must be NaN, or the call must fail with an error
that names the bad input (the SavedModel keeps the assertions: it raises).
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
import runtimes

from keras_posenc import LearnedPositionalEmbedding, RotaryEmbedding, SinusoidalPositionalEncoding
from keras_posenc import export as kpe

MAX_POSITIONS = 4096 * 4096
LEARNED_LENGTH = 64
LIMITS = {"sinusoidal": MAX_POSITIONS, "learned": LEARNED_LENGTH, "rotary": MAX_POSITIONS}
STEPS = 3


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    x = keras.Input((None, 4), name="x")
    heads = keras.Input((None, 1, 4), name="heads")
    start = keras.Input(batch_shape=(), dtype="int32", name="start_index")
    positions = keras.Input((None,), dtype="int32", name="positions")
    layers = {
        "sinusoidal": (SinusoidalPositionalEncoding(), x),
        "learned": (LearnedPositionalEmbedding(LEARNED_LENGTH), x),
        "rotary": (RotaryEmbedding(), heads),
    }
    outputs = {}
    for kind, (layer, inputs) in layers.items():
        outputs[f"{kind}_start"] = layer(inputs, start_index=start)
        outputs[f"{kind}_positions"] = layer(inputs, positions=positions)
    model = keras.Model(
        {"x": x, "heads": heads, "start_index": start, "positions": positions}, outputs
    )
    folder = tmp_path_factory.mktemp("bad_positions")
    saved = kpe.save_saved_model(model, folder / "saved_model")
    onnx_path = kpe.save_onnx(model, folder / "model.onnx")
    litert_path = kpe.save_litert(model, folder / "model.tflite")
    return model, saved, onnx_path, litert_path


def _runners(artifacts):
    _, saved, onnx_path, litert_path = artifacts
    return runtimes.runners(saved, onnx_path, litert_path)


# (bad input, start_index, positions): each makes some positions bad for some layers.
CASES = {
    "negative start": ("start_index", -1, [0, 1, 2]),
    "start far below zero": ("start_index", -(2**31), [0, 1, 2]),
    "run past the learned table": ("start_index", LEARNED_LENGTH - 2, [0, 1, 2]),
    "run past MAX_POSITIONS": ("start_index", MAX_POSITIONS - 2, [0, 1, 2]),
    "start at the int32 maximum": ("start_index", 2**31 - 1, [0, 1, 2]),
    "negative position": ("positions", 0, [0, -1, 2]),
    "position past the learned table": ("positions", 0, [0, LEARNED_LENGTH, 1]),
    "position at MAX_POSITIONS": ("positions", 0, [MAX_POSITIONS, 0, 1]),
}


def _feeds(start: int, positions: list[int]) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {
        "x": rng.standard_normal((2, STEPS, 4)).astype(np.float32),
        "heads": rng.standard_normal((2, STEPS, 1, 4)).astype(np.float32),
        "start_index": np.array(start, np.int32),
        "positions": np.tile(np.array(positions, np.int32), (2, 1)),
    }


def _bad_steps(kind: str, source: str, start: int, positions: list[int]) -> np.ndarray:
    """The steps whose position is outside `[0, limit)` for this layer."""
    where = start + np.arange(STEPS, dtype=np.int64) if source == "start" else np.array(positions)
    return np.flatnonzero((where < 0) | (where >= LIMITS[kind]))


@pytest.mark.parametrize("runtime", ["saved_model", "onnxruntime", "litert"])
@pytest.mark.parametrize("case", list(CASES))
def test_bad_positions_give_nan_rows_or_an_error_naming_the_input(artifacts, runtime, case):
    bad_input, start, positions = CASES[case]
    run = _runners(artifacts)[runtime]
    try:
        outputs = run(_feeds(start, positions))
    except Exception as error:  # allowed: an error that names the input
        assert bad_input in str(error), f"{runtime} raised without naming {bad_input}: {error}"
        return
    checked = 0
    for kind in LIMITS:
        for source in ("start", "positions"):
            bad = _bad_steps(kind, source, start, positions)
            if bad.size:
                rows = np.asarray(outputs[f"{kind}_{source}"])[:, bad]
                assert np.isnan(rows).all(), f"{runtime}: finite {kind}_{source} rows at {bad}"
                checked += 1
    assert checked > 0


@pytest.mark.parametrize("runtime", ["saved_model", "onnxruntime", "litert"])
def test_a_negative_start_of_a_run_longer_than_the_cache_gives_nan(artifacts, runtime):
    # start <= 4096 - length holds for such a start: it must not take the cached rows, and
    # no table's slice may stop at its end (the learned one, a bounded one: the runtime
    # then fails on a shape instead).
    steps, start = 4100, -10
    rng = np.random.default_rng(1)
    feeds = {
        "x": rng.standard_normal((1, steps, 4)).astype(np.float32),
        "heads": rng.standard_normal((1, steps, 1, 4)).astype(np.float32),
        "start_index": np.array(start, np.int32),
        "positions": np.arange(steps, dtype=np.int32)[None],
    }
    run = _runners(artifacts)[runtime]
    try:
        outputs = run(feeds)
    except Exception as error:  # allowed: an error that names the input
        assert "start_index" in str(error), f"{runtime} raised without naming it: {error}"
        return
    for kind in LIMITS:
        rows = np.asarray(outputs[f"{kind}_start"])
        assert rows.shape[1] == steps
        assert np.isnan(rows[:, :-start]).all(), kind
