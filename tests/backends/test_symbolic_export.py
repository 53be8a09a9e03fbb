"""The encoder layers under `jax.export` with a symbolic sequence length and batch.

Keras's `model.export(format="tf_saved_model")` from JAX traces a `keras.Input((None, ...))`
so (jax2tf). The exported function must give the eager outputs at every concrete length,
across the cached rows (4096) and past them, and NaN where an eager call raises: inside the
exported function nothing can raise. Every case of `cases.py` runs so, with its start
static and traced; then runs across the cached rows; then Keras's own export, reloaded in
a fresh TensorFlow process.
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import cases
import keras
import numpy as np
import pytest
from stablehlo_versions import UNREADABLE_OPERATION, tensorflow_reads_jax_exports

import keras_posenc as kp

BACKEND = keras.backend.backend()
pytestmark = pytest.mark.skipif(BACKEND != "jax", reason="jax.export")

# One step, and a run across longrope's switch (16) and from 4090 across the cached rows;
# the learned cases also past their 40 rows. Each length costs a compilation of every
# eager op on JAX, so no length is added that crosses no boundary (dynamic NTK's case
# starts at 36, past its switch at 32, at any length).
LENGTHS = (1, 17)
LEARNED_LENGTHS = (*LENGTHS, 40)
# (start, length): inside, ending at, and across the 4096 cached rows (from 0 and from near
# their end), past them, and a run longer than the cache past 2^20. Each static start is an
# export and each length a compilation: the runs are few, each on another side of a boundary.
RUNS = (
    (0, 1),
    (0, 4096),
    (0, 4097),
    (4090, 7),
    (4100, 5),
    (2**20 + 3, 4100),
)
# The cases exported whole: one per kind of table and of call (a host run inside and across
# the cache, explicit positions, several axes, a learned table, a switch by length, dynamic
# NTK, a mask, heads before the sequence, partial interleaved RoPE, narrow dtypes); with a
# traced start too where the case has one. (Every case also runs under jax.jit in
# test_encoders.py; what is symbolic-only is which rows a run takes.)
EXPORTED = (
    "sinusoidal_run",
    "sinusoidal_past_cache",
    "sinusoidal_positions",
    "sinusoidal_axes",
    "sinusoidal_float16",
    "learned_start",
    "learned_positions",
    "rotary_run",
    "rotary_interleaved_partial",
    "rotary_heads_first",
    "rotary_longrope_long",
    "rotary_dynamic_long",
    "rotary_mask",
    "rotary_axial",
    "rotary_bfloat16",
)
# Lengths served by TensorFlow from Keras's export: across the cached rows, past 5000.
RUNS_SERVED = (1, 7, 4095, 4097, 5001)
TABLE_ERROR = 2.5e-7  # a split-table value's error (frequencies.py), float32 rounding included


def _spec(value, symbols, batch_axis, sequence_axis):
    """A `jax.ShapeDtypeStruct` of `value` with the batch and sequence axes `symbols`."""
    import jax

    batch, sequence = symbols
    shape = list(np.shape(value))
    if batch_axis is not None:
        shape[batch_axis] = batch
    shape[sequence_axis] = sequence
    return jax.ShapeDtypeStruct(tuple(shape), keras.ops.convert_to_tensor(value).dtype)


def _resized(value, length: int, axis: int):
    """`value` (positions, a mask, an input) with `length` steps on `axis`, repeating it."""
    return np.take(value, np.arange(length) % np.shape(value)[axis], axis=axis)


def _tolerance(layer, x) -> float:
    """XLA may fuse the rotation or the split's products into FMAs: a table error and a
    rounding of values of size |x| + 1 apart; a narrow output one rounding of its own."""
    size = float(np.abs(x).max()) + 1.0
    dtype = keras.backend.standardize_dtype(layer.compute_dtype)
    if dtype in ("float16", "bfloat16"):
        return size * (2.0**-8 if dtype == "bfloat16" else 2.0**-11)
    return 4 * TABLE_ERROR * size


def _compare(layer, exported, x, fixed: dict, traced: dict, what: str, exact=False):
    """The exported call against the eager one; NaN everywhere where the eager call raises;
    `exact`: equal (the same rows added, nothing XLA could fuse)."""
    output = np.asarray(keras.ops.cast(exported.call(x, traced), "float32"))
    try:
        eager = layer(x, **fixed, **traced)
    except ValueError:
        assert np.all(np.isnan(output)), f"{what}: eager raises, exported not all NaN"
        return
    eager = keras.ops.convert_to_numpy(keras.ops.cast(eager, "float32"))
    assert output.shape == eager.shape, what
    assert np.all(np.isfinite(output)), what
    atol = 0.0 if exact else _tolerance(layer, x)
    np.testing.assert_allclose(output, eager, rtol=0, atol=atol, err_msg=what)


def _export(layer, x, fixed: dict, traced: dict, sequence_axis: int, multi_axis: bool):
    import jax
    from jax import export

    symbols = export.symbolic_shape("b, s")  # one scope for all the arguments
    specs = {}
    for key, value in traced.items():
        if key == "start_index":
            specs[key] = jax.ShapeDtypeStruct((), np.int32)
        elif key == "mask":
            specs[key] = _spec(value, symbols, 0, 1)
        else:  # positions: (sequence,) or (batch, sequence), with a last axis per coordinate
            rank = np.ndim(value) - int(multi_axis)
            specs[key] = _spec(value, symbols, 0 if rank == 2 else None, rank - 1)
    x_spec = _spec(x, symbols, 0, sequence_axis)
    function = jax.jit(lambda x, traced: layer(x, **fixed, **traced))
    return export.export(function)(x_spec, specs)


@pytest.mark.parametrize(
    "name, start",
    [(name, "static") for name in EXPORTED]
    + [(name, "traced") for name in EXPORTED if "start_index" in cases.CASES[name][3]],
)
def test_every_case_exports_with_a_symbolic_sequence(name, start):
    _, arguments, shape, call = cases.CASES[name]
    layer = cases.build(name)
    sequence_axis = arguments.get("sequence_axis", 1)
    multi_axis = any(k in arguments for k in ("axes", "axes_dims", "mrope_section"))
    fixed = {k: v for k, v in call.items() if k == "start_index" and start == "static"}
    traced = {k: v for k, v in call.items() if k not in fixed}
    if "start_index" in traced:
        traced["start_index"] = np.int32(traced["start_index"])
    x = np.asarray(keras.ops.cast(cases.inputs(name), layer.compute_dtype))
    exported = _export(layer, x, fixed, traced, sequence_axis, multi_axis)
    for length in LEARNED_LENGTHS if name.startswith("learned") else LENGTHS:
        x_now = _resized(x, length, sequence_axis)
        traced_now = {}
        for key, value in traced.items():
            if key == "start_index":
                traced_now[key] = value
            else:
                axis = 1 if key == "mask" else np.ndim(value) - 1 - int(multi_axis)
                traced_now[key] = _resized(value, length, axis)
        _compare(layer, exported, x_now, fixed, traced_now, f"{name}, {start}, length {length}")


def _run_layer(kind: str):
    rng = np.random.default_rng(sum(map(ord, kind)))
    if kind == "rotary":
        return kp.RotaryEmbedding(), rng.standard_normal((2, 8, 2, 16)).astype(np.float32)
    x = rng.standard_normal((2, 8, 16)).astype(np.float32)
    if kind == "sinusoidal":
        return kp.SinusoidalPositionalEncoding(), x
    layer = kp.LearnedPositionalEmbedding(4200)
    layer.build(x.shape)
    layer.embeddings.assign(cases.learned_table(4200, 16))
    return layer, x


@pytest.mark.parametrize("start", ["static", "traced"])
@pytest.mark.parametrize("kind", ["sinusoidal", "rotary", "learned"])
def test_runs_across_the_cached_rows(kind, start):
    """The eager rows at every length: the cached rows while a run fits them, the split
    rows past them; a learned run past its 4200 rows is NaN. An addition of the cached rows
    (or of a learned table's) is exact: the split rows, a table error apart, would not be."""
    layer, x = _run_layer(kind)
    layer(x)
    exported = {}
    for first, length in RUNS:
        key = first if start == "static" else None
        fixed = {"start_index": first} if start == "static" else {}
        traced = {} if start == "static" else {"start_index": np.int32(first)}
        if key not in exported:
            try:
                exported[key] = _export(layer, x, fixed, traced, 1, False)
            except ValueError:  # a static start past a learned table: known bad
                exported[key] = None
        x_now = _resized(x, length, 1)
        if exported[key] is None:
            assert kind == "learned" and first >= 4200
            with pytest.raises(ValueError, match="within 4200"):
                layer(x_now, **fixed)
            continue
        exact = kind == "learned" or (kind == "sinusoidal" and first + length <= 4096)
        what = f"{kind}, start {first}, length {length}"
        _compare(layer, exported[key], x_now, fixed, traced, what, exact)


@functools.cache
def _bad_input_layer(kind: str):
    """`(layer, x)`: one built layer of `kind` for every bad value of the module."""
    scaling = {"dynamic": cases.DYNAMIC, "longrope": cases.LONGROPE}.get(kind)
    if kind == "sinusoidal":
        layer, x = kp.SinusoidalPositionalEncoding(), np.ones((2, 5, 16), np.float32)
    elif kind == "learned":
        layer, x = kp.LearnedPositionalEmbedding(40), np.ones((2, 5, 16), np.float32)
    else:
        layer, x = kp.RotaryEmbedding(scaling=scaling), np.ones((2, 5, 2, 16), np.float32)
    layer(x)
    return layer, x


@functools.cache
def _traced_export(kind: str, argument: str):
    """`kind`'s layer exported with `argument` traced: one program for every value of it
    (a start is a traced int32 scalar, positions a traced `(sequence,)` vector)."""
    layer, x = _bad_input_layer(kind)
    example = np.int32(0) if argument == "start_index" else np.zeros(5, np.int32)
    return _export(layer, x, {}, {argument: example}, 1, False)


@pytest.mark.parametrize("kind", ["sinusoidal", "learned", "rotary", "dynamic", "longrope"])
@pytest.mark.parametrize(
    "argument, value",
    [
        ("start_index", -1),
        ("start_index", 2**24 - 3),
        ("start_index", 2**31 - 1),
        ("positions", np.array([0] * 4 + [2**24], np.int32)),
        ("positions", np.array([0] * 4 + [-1], np.int32)),
    ],
)
def test_bad_input_is_nan_when_exported(kind, argument, value):
    layer, x = _bad_input_layer(kind)
    if kind == "learned" and argument == "start_index" and value == 2**24 - 3:
        value = 38  # past a 40-row table
    traced = {argument: np.int32(value) if argument == "start_index" else value}
    exported = _traced_export(kind, argument)
    assert np.all(np.isnan(np.asarray(exported.call(x, traced))))
    if argument == "start_index" and 0 <= value < 2**24:
        # Static, a start below the limit is known good; the run's end only at run time.
        static = _export(layer, x, {"start_index": value}, {}, 1, False)
        assert np.all(np.isnan(np.asarray(static.call(x, {}))))


@pytest.mark.parametrize("start, message", [(-1, "must be >= 0"), (2**24, "stay below")])
def test_bad_static_start_raises_when_exported(start, message):
    layer, x = kp.SinusoidalPositionalEncoding(), np.ones((2, 5, 16), np.float32)
    with pytest.raises(ValueError, match=message):
        _export(layer, x, {"start_index": start}, {}, 1, False)


def test_keras_infers_shapes_through_a_layer_that_calls_one():
    """Keras infers a layer's output shape on JAX by tracing its `call` with one symbolic
    size for every `None` (`compute_output_spec`): a layer of the user's that calls ours."""

    class Doubled(keras.layers.Layer):
        def __init__(self):
            super().__init__()
            self.rotary = kp.RotaryEmbedding()

        def call(self, x):
            return 2.0 * self.rotary(x)

    inputs = keras.Input((None, 2, 16))
    model = keras.Model(inputs, Doubled()(inputs))
    assert tuple(model.output.shape) == (None, None, 2, 16)
    x = np.random.default_rng(0).standard_normal((1, 4100, 2, 16)).astype(np.float32)
    np.testing.assert_array_equal(
        keras.ops.convert_to_numpy(model(x)),
        2.0 * keras.ops.convert_to_numpy(kp.RotaryEmbedding()(x)),
    )


# --------------------------------------------------------------------------------------
# Keras's own `model.export(format="tf_saved_model")`, served by TensorFlow


def _model():
    inputs = keras.Input((None,), dtype="int32")
    x = keras.layers.Embedding(50, 32)(inputs)
    x = kp.SinusoidalPositionalEncoding()(x)
    x = kp.LearnedPositionalEmbedding(5000)(x)
    x = keras.layers.Reshape((-1, 2, 16))(x)
    x = kp.RotaryEmbedding(scaling=cases.LONGROPE)(x)
    return keras.Model(inputs, keras.layers.Reshape((-1, 32))(x))


@pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None, reason="TensorFlow")
def test_keras_export_serves_a_dynamic_sequence_on_tensorflow(tmp_path):
    """No input_signature: Keras names the sequence axis of `keras.Input((None,))`; the
    SavedModel, reloaded by TensorFlow in a fresh process, gives JAX's outputs at lengths
    across the cached rows and NaN past the learned table (where JAX raises)."""
    keras.utils.set_random_seed(0)
    model = _model()
    model.export(tmp_path / "saved_model", format="tf_saved_model")
    rng = np.random.default_rng(0)
    tokens = {f"tokens_{n}": rng.integers(0, 50, (2, n)).astype(np.int32) for n in RUNS_SERVED}
    np.savez(tmp_path / "tokens.npz", **tokens)
    run = subprocess.run(
        [sys.executable, str(Path(__file__).with_name("serve_keras_export.py")), str(tmp_path)],
        env={**os.environ, "KERAS_BACKEND": "tensorflow", "TF_CPP_MIN_LOG_LEVEL": "2"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    import jax

    tensorflow_version = importlib.metadata.version("tensorflow")
    if not tensorflow_reads_jax_exports(jax.__version__, tensorflow_version):
        assert UNREADABLE_OPERATION in (tmp_path / "error.txt").read_text()
        return
    served = np.load(tmp_path / "served.npz")
    for name, value in tokens.items():
        output = served[name.replace("tokens", "outputs")]
        if value.shape[1] > 5000:
            with pytest.raises(ValueError, match="positions run to"):
                model(value)
            assert np.all(np.isnan(output)), name
            continue
        expected = keras.ops.convert_to_numpy(model(value))
        # The same XLA program on both sides: only fusion may differ, by an FMA rounding.
        atol = 4 * TABLE_ERROR * (np.abs(expected).max() + 1.0)
        np.testing.assert_allclose(output, expected, rtol=0, atol=atol, err_msg=name)
