"""The encoder layers under KERAS_BACKEND=jax / torch: the float64 formula, TensorFlow's results.

Run by tests/test_backends.py in a process per backend, with POSENC_TF_RESULTS naming the
TensorFlow outputs of every case (`cases.py`). Each case's eager output must lie within the
float32 error of the float64 formula (where the formula is short enough to write here) and
of TensorFlow's output; under JAX also inside `jax.jit`, with the call arguments traced or
static. Bad input raises where it is known and gives NaN where `jax.jit` traces it.
"""

from __future__ import annotations

import os

import cases
import keras
import numpy as np
import pytest
from reference import assert_rounded_once, inverse_frequencies, sinusoidal

BACKEND = keras.backend.backend()
TABLE_ERROR = 2.5e-7  # a split-table value's error (frequencies.py), float32 rounding included
ROUNDING = 2.0**-23  # two float32 roundings (product, sum), relative


@pytest.fixture(scope="module")
def tf_results():
    return dict(np.load(os.environ["POSENC_TF_RESULTS"]))


# --------------------------------------------------------------------------------------
# float64 references


def _rotary(x, theta, layout: str, rotary_dim: int, sequence_axis: int = 1, scale=1.0):
    """RoPE with angles `theta` `(batch or 1, sequence, pairs)`; also the error bound."""
    x = np.moveaxis(np.asarray(x, np.float64), sequence_axis, 1)
    theta = theta.reshape(theta.shape[:2] + (1,) * (x.ndim - 3) + theta.shape[2:])
    sin, cos = scale * np.sin(theta), scale * np.cos(theta)
    half = rotary_dim // 2
    first = np.arange(half) if layout == "half" else np.arange(0, rotary_dim, 2)
    second = first + half if layout == "half" else first + 1
    a, b = x[..., first], x[..., second]
    y = x.copy()
    y[..., first] = a * cos - b * sin
    y[..., second] = b * cos + a * sin
    size = np.zeros_like(x)
    size[..., first] = size[..., second] = np.abs(a) + np.abs(b)
    return np.moveaxis(y, 1, sequence_axis), np.moveaxis(size, 1, sequence_axis)


def _theta(positions, omega):
    positions = np.asarray(positions, np.float64)
    if positions.ndim == 1:
        positions = positions[None]
    return positions[..., None] * omega


def _run_positions(call: dict, length: int) -> np.ndarray:
    return np.arange(length) + call.get("start_index", 0)


def expected(name: str):
    """`(float64 output, error bound)` of a case, or None where only TensorFlow is compared."""
    class_name, arguments, shape, call = cases.CASES[name]
    x = cases.inputs(name).astype(np.float64)
    length = shape[1] if arguments.get("sequence_axis", 1) == 1 else shape[2]
    positions = call.get("positions", _run_positions(call, length))
    if class_name == "LearnedPositionalEmbedding":
        table = cases.learned_table(arguments["max_length"], shape[-1]).astype(np.float64)
        y = x + table[np.asarray(positions)]
        return y, ROUNDING * np.abs(y)
    if class_name == "SinusoidalPositionalEncoding":
        return _sinusoidal_expected(arguments, x, positions)
    if name in ("rotary_yarn", "rotary_llama3"):
        return None
    rotary_dim = arguments.get("rotary_dim", shape[-1])
    omega, scale = inverse_frequencies(rotary_dim), 1.0
    scaling = arguments.get("scaling") or {}
    total = int(np.max(positions)) + 1
    if scaling.get("rope_type") == "linear":
        omega = omega / scaling["factor"]
    elif scaling.get("rope_type") == "dynamic" and total > cases.DYNAMIC["max_position_embeddings"]:
        omega = inverse_frequencies(rotary_dim, cases.dynamic_base(total, rotary_dim))
    elif scaling.get("rope_type") == "longrope":
        long = total > cases.LONGROPE["original_max_position_embeddings"]
        omega = omega / np.asarray(cases.LONGROPE["long_factor" if long else "short_factor"])
        scale = cases.longrope_factor()
    if "mask" in call:
        positions = np.maximum(np.cumsum(call["mask"], axis=1) - 1, 0)
    if "axes_dims" in arguments or "mrope_section" in arguments:
        theta = _axes_theta(arguments, positions, rotary_dim)
    else:
        theta = _theta(positions, omega)
    y, size = _rotary(
        x,
        theta,
        arguments.get("layout", "half"),
        rotary_dim,
        arguments.get("sequence_axis", 1),
        scale,
    )
    bound = (TABLE_ERROR + ROUNDING) * size * max(scale, 1.0)
    if scaling.get("rope_type") == "dynamic":
        # The dynamic frequencies are float32, made per call: a few ulps of ω, times p·ω.
        bound += size * 4 * 2.0**-24 * float(np.max(theta))
    return y, bound


def _axes_theta(arguments, positions, rotary_dim):
    positions = np.asarray(positions, np.float64)
    if "axes_dims" in arguments:
        omega = np.concatenate([inverse_frequencies(d) for d in arguments["axes_dims"]])
        axis = np.repeat(
            np.arange(len(arguments["axes_dims"])), [d // 2 for d in arguments["axes_dims"]]
        )
    else:
        omega = inverse_frequencies(rotary_dim)
        section = arguments["mrope_section"]
        axis = np.repeat(np.arange(len(section)), section)
    return (positions[..., axis] * omega)[None]


def _sinusoidal_expected(arguments, x, positions):
    width = x.shape[-1]
    layout = arguments.get("layout", "interleaved")
    if arguments.get("axes", 1) > 1:
        blocks = [sinusoidal(positions[:, a], width // 2, layout=layout) for a in range(2)]
        encoding = np.concatenate(blocks, -1)
    elif arguments.get("frequency_spacing") == "tensor2tensor":
        pairs = width // 2
        theta = np.asarray(positions, np.float64)[:, None] * 1e4 ** (
            -np.arange(pairs) / (pairs - 1)
        )
        encoding = np.concatenate([np.sin(theta), np.cos(theta)], -1)
    else:
        encoding = sinusoidal(positions, width, layout=layout)
    y = x + encoding
    return y, TABLE_ERROR + ROUNDING * (np.abs(x) + 1.0)


def _within(actual, want, bound, what: str):
    error = np.abs(np.asarray(actual, np.float64) - want)
    bound = np.broadcast_to(bound, error.shape)
    worst = np.unravel_index(np.argmax(error - bound), error.shape)
    assert np.all(error <= bound), (
        f"{what}: error {error[worst]:.3g} above the bound {bound[worst]:.3g} at {worst}"
    )


# --------------------------------------------------------------------------------------
# The cases


def _check_case(name: str, actual, tf_results):
    dtype = cases.CASES[name][1].get("dtype", "")
    reference = expected(name)
    if "bfloat16" in dtype or "float16" in dtype:
        bits = 7 if "bfloat16" in dtype else 10
        assert_rounded_once(actual, reference[0], bits)
        # Both round the same float32 value once, but the tables may differ by their error.
        assert np.mean(actual == tf_results[name]) > 0.99
        return
    if reference is not None:
        _within(actual, *reference, f"{name} against the float64 formula")
        bound = 2 * reference[1]
    else:
        bound = 2 * (TABLE_ERROR + ROUNDING) * 2 * np.abs(cases.inputs(name)).max()
    _within(actual, tf_results[name], bound, f"{name} against TensorFlow")


@pytest.mark.parametrize("name", sorted(cases.CASES))
def test_eager(name, tf_results):
    _check_case(name, cases.run(name), tf_results)


def _jitted(name: str, static: bool):
    import jax

    layer = cases.build(name)
    call = cases.CASES[name][3]
    x = keras.ops.cast(cases.inputs(name), layer.compute_dtype)
    if static:
        function = jax.jit(lambda x: layer(x, **call))
        output = function(x)
    else:
        traced = {k: keras.ops.convert_to_tensor(v) for k, v in call.items()}
        output = jax.jit(lambda x, traced: layer(x, **traced))(x, traced)
    return keras.ops.convert_to_numpy(keras.ops.cast(output, "float32")).astype(np.float64)


@pytest.mark.skipif(BACKEND != "jax", reason="jax.jit")
@pytest.mark.parametrize("name", sorted(cases.CASES))
def test_jit_traced(name, tf_results):
    _check_case(name, _jitted(name, static=False), tf_results)


# A static start takes its own paths under jit (a constant of the run's rows, the exact host
# rows past the cache); static positions are checked as known values, as eagerly.
@pytest.mark.skipif(BACKEND != "jax", reason="jax.jit")
@pytest.mark.parametrize(
    "name", sorted(n for n, c in cases.CASES.items() if "positions" not in c[3])
)
def test_jit_static(name, tf_results):
    _check_case(name, _jitted(name, static=True), tf_results)
