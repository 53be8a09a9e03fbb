"""The encoder layers on JAX / torch beyond their values: bad input, compilations, training.

Bad input raises a clear error where its value is known (eagerly) and gives NaN where
`jax.jit` traces it, as XLA does in TensorFlow; a traced start or positions compile once
per shape; the layers train inside a Keras model (the attention layers: test_attention_*).
"""

from __future__ import annotations

import functools

import keras
import numpy as np
import pytest

import keras_posenc as kp

BACKEND = keras.backend.backend()
X = np.random.default_rng(0).standard_normal((2, 12, 16)).astype(np.float32)
Q = X.reshape(2, 12, 2, 8)


def _layers():
    return {
        "sinusoidal": (kp.SinusoidalPositionalEncoding(), X),
        "learned": (kp.LearnedPositionalEmbedding(40), X),
        "rotary": (kp.RotaryEmbedding(), Q),
        # More row values than a `where` serves: a conditional under jit.
        "rotary_long": (kp.RotaryEmbedding(), np.tile(Q, (1, 8, 1, 1))),
        "dynamic": (
            kp.RotaryEmbedding(
                scaling={"rope_type": "dynamic", "factor": 2.0, "max_position_embeddings": 32}
            ),
            Q,
        ),
    }


@pytest.mark.parametrize("kind", ["sinusoidal", "learned", "rotary", "dynamic"])
@pytest.mark.parametrize(
    "call, message",
    [
        ({"start_index": -1}, "start_index must be >= 0"),
        ({"positions": np.full(12, 2**24, np.int32)}, "positions must be below"),
        ({"positions": np.full(12, -3, np.int32)}, "positions must be >= 0"),
        ({"positions": np.zeros(11, np.int32)}, "give one position per step"),
        ({"positions": np.zeros(12, np.float32)}, "positions must be integers"),
        ({"start_index": np.zeros(2, np.int32)}, "start_index must be a scalar"),
    ],
)
def test_bad_input_raises_eagerly(kind, call, message):
    layer, x = _layers()[kind]
    with pytest.raises((ValueError, TypeError), match=message):
        layer(x, **call)


@pytest.mark.parametrize("kind", ["sinusoidal", "learned", "rotary", "dynamic"])
@pytest.mark.parametrize(
    "call",
    [
        {"start_index": np.int64(2**33)},
        {"start_index": np.int64(2**32 + 5)},
        {"start_index": np.uint64(2**63)},
        {"positions": np.arange(12, dtype=np.int64) + 2**32},
    ],
)
def test_integers_past_int32_raise(kind, call):
    """numpy integers past int32 are past every table: an error on every backend, not the
    rows of their low 32 bits (what JAX without x64 makes of them)."""
    layer, x = _layers()[kind]
    with pytest.raises(ValueError, match="past int32"):
        layer(x, **call)


@pytest.mark.parametrize("dtype", [np.uint8, np.int16, np.uint32, np.int64])
def test_positions_of_any_integer_dtype(dtype):
    """Positions of a narrow or unsigned integer dtype are their values, eager and traced."""
    layer, x = _layers()["rotary"]
    positions = np.arange(3, 15).astype(dtype)
    expected = keras.ops.convert_to_numpy(layer(x, positions=positions.astype(np.int32)))
    np.testing.assert_array_equal(
        keras.ops.convert_to_numpy(layer(x, positions=positions)), expected
    )
    if BACKEND == "jax":
        import jax

        traced = np.asarray(jax.jit(lambda x, p: layer(x, positions=p))(x, positions))
        atol = 4 * 2.5e-7 * np.abs(x).max()  # XLA may fuse the rotation into FMAs
        np.testing.assert_allclose(traced, expected, rtol=0, atol=atol)


def test_learned_run_past_its_table_raises():
    with pytest.raises(ValueError, match="larger max_length"):
        kp.LearnedPositionalEmbedding(40)(X, start_index=30)


def test_integer_input_raises():
    with pytest.raises(TypeError, match="floating-point input"):
        kp.RotaryEmbedding()(Q.astype(np.int32))


@pytest.mark.skipif(BACKEND != "jax", reason="jax.jit")
@pytest.mark.parametrize("kind", ["sinusoidal", "learned", "rotary", "dynamic"])
@pytest.mark.parametrize(
    "argument, value",
    [
        ("start_index", -1),
        ("start_index", 2**24 - 5),
        ("start_index", 2**31 - 1),
        ("positions", np.array([0] * 11 + [2**24], np.int32)),
        ("positions", np.array([0] * 11 + [-1], np.int32)),
    ],
)
def test_bad_input_is_nan_under_jit(kind, argument, value):
    if kind == "learned" and argument == "start_index" and value == 2**24 - 5:
        value = 30  # past a 40-row table
    x, jitted = _jitted_with(kind, argument)
    assert np.all(np.isnan(np.asarray(jitted(x, value))))


@functools.cache
def _jitted_with(kind: str, argument: str):
    """`(x, jitted)`: `kind`'s layer under `jax.jit` with `argument` traced, one
    compilation for every bad value of it."""
    import jax

    layer, x = _layers()[kind]
    layer(x)  # built, and a good call
    return x, jax.jit(lambda x, v: layer(x, **{argument: v}))


@pytest.mark.skipif(BACKEND != "jax", reason="jax.jit")
@pytest.mark.parametrize("kind", ["sinusoidal", "learned", "rotary", "rotary_long", "dynamic"])
def test_jit_compiles_once_per_shape(kind):
    import jax

    layer, x = _layers()[kind]
    layer(x)  # built outside the trace: its weights are made eagerly
    traces = []

    def call(x, start):
        traces.append(start)
        return layer(x, start_index=start)

    function = jax.jit(call)
    starts = [0, 3, 20] if kind == "learned" else [0, 3, 5000, 40]
    outputs = [np.asarray(function(x, np.int32(s))) for s in starts]
    assert len(traces) == 1
    for start, output in zip(starts, outputs, strict=True):
        eager = keras.ops.convert_to_numpy(layer(x, start_index=start))
        # XLA may contract the split's products into FMAs: a table error apart at most.
        np.testing.assert_allclose(output, eager, rtol=0, atol=4 * 2.5e-7 * np.abs(x).max())


TABLE_KINDS = ["sinusoidal", "rotary", "rotary_long", "dynamic"]
TRACES = ["traced_start", "int_start", "fori_loop"]


@pytest.mark.skipif(BACKEND != "jax", reason="jax.jit")
@pytest.mark.parametrize("kind", TABLE_KINDS)
@pytest.mark.parametrize("trace", TRACES)
def test_a_trace_of_a_constant_input_leaves_the_table_usable(kind, trace):
    """A trace whose input is a constant (closed over) must not keep a traced value in the
    table the layers share: every later call, eager or traced, would fail."""
    import jax

    # A table of its own (tables are shared by configuration), first used inside the trace.
    wavelength = 20000.0 + 100 * TABLE_KINDS.index(kind) + TRACES.index(trace)
    layer, x = _layers()[kind]
    layer = type(layer).from_config({**layer.get_config(), "max_wavelength": wavelength})
    x = keras.ops.convert_to_tensor(x)
    start = 5000 if kind == "rotary_long" else 9
    if trace == "traced_start":
        traced = jax.jit(lambda s: layer(x, start_index=s))(np.int32(start))
    elif trace == "int_start":
        traced = jax.jit(lambda: layer(x, start_index=start))()
    else:
        traced = jax.lax.fori_loop(
            start, start + 1, lambda s, _: layer(x, start_index=s), keras.ops.zeros_like(x)
        )
    eager = keras.ops.convert_to_numpy(layer(x, start_index=start))
    again = jax.jit(lambda s: layer(x, start_index=s))(np.int32(start))
    atol = 4 * 2.5e-7 * np.abs(keras.ops.convert_to_numpy(x)).max()
    np.testing.assert_allclose(np.asarray(traced), eager, rtol=0, atol=atol)
    np.testing.assert_allclose(np.asarray(again), eager, rtol=0, atol=atol)


@pytest.mark.skipif(BACKEND != "jax", reason="jax.export")
@pytest.mark.parametrize("kind", ["sinusoidal", "learned", "rotary", "dynamic"])
def test_exports_with_a_symbolic_batch(kind):
    """`jax.export` with a symbolic batch, as Keras's `model.export` from JAX traces (jax2tf):
    a layer must not need the batch size as a number."""
    import jax
    from jax import export

    layer, x = _layers()[kind]
    layer(x)
    dims = ", ".join(["batch"] + [str(size) for size in x.shape[1:]])
    spec = jax.ShapeDtypeStruct(export.symbolic_shape(dims), x.dtype)
    exported = export.export(jax.jit(lambda v: layer(v)))(spec)
    for batch in (1, 2):
        eager = keras.ops.convert_to_numpy(layer(x[:batch]))
        # XLA may fuse the rotation into FMAs: one rounding of values of size |x| apart.
        atol = 4 * 2.5e-7 * np.abs(x).max()
        np.testing.assert_allclose(np.asarray(exported.call(x[:batch])), eager, rtol=0, atol=atol)


def test_trains_in_a_model():
    inputs = keras.Input((12, 16))
    x = kp.SinusoidalPositionalEncoding()(inputs)
    x = kp.LearnedPositionalEmbedding(12)(x)
    x = keras.layers.Reshape((12, 2, 8))(x)
    x = kp.RotaryEmbedding()(x)
    outputs = keras.layers.Dense(1)(keras.layers.Flatten()(x))
    model = keras.Model(inputs, outputs)
    model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")
    before = keras.ops.convert_to_numpy(model.layers[2].embeddings).copy()
    history = model.fit(X, np.ones((2, 1), np.float32), epochs=2, verbose=0)
    assert np.all(np.isfinite(history.history["loss"]))
    assert not np.allclose(keras.ops.convert_to_numpy(model.layers[2].embeddings), before)
    assert model.predict(X, verbose=0).shape == (2, 1)


def test_saved_and_loaded_as_keras_file(tmp_path):
    inputs = keras.Input((12, 16))
    x = kp.LearnedPositionalEmbedding(12)(kp.SinusoidalPositionalEncoding()(inputs))
    x = keras.layers.Reshape((12, 2, 8))(x)
    outputs = kp.RotaryEmbedding(scaling={"rope_type": "linear", "factor": 2.0})(x)
    model = keras.Model(inputs, outputs)
    path = tmp_path / "model.keras"
    model.save(path)
    loaded = keras.saving.load_model(path)
    np.testing.assert_array_equal(
        keras.ops.convert_to_numpy(loaded(X)), keras.ops.convert_to_numpy(model(X))
    )


def test_sinusoidal_initializer_and_resize():
    import reference
    from float32_error import U, assert_within_bound

    layer = kp.LearnedPositionalEmbedding(8, embeddings_initializer="sinusoidal")
    zeros = np.zeros((1, 8, 16), np.float32)
    table = keras.ops.convert_to_numpy(layer(zeros))[0]
    # The formula rounded once to float32 (a float64 sin's error far below): u of each entry.
    exact = reference.sinusoidal(np.arange(8), 16)
    assert_within_bound(table, exact, U * np.abs(exact) + 2.0**-50, what="initial rows")
    layer.resize(15)
    resized = keras.ops.convert_to_numpy(layer(np.zeros((1, 15, 16), np.float32)))[0]
    expected = reference.linear_resize(table, 15)
    # Interpolated in float64 and rounded once to float32: u of each entry.
    assert_within_bound(resized, expected, U * np.abs(expected) + 2.0**-50, what="resized")
