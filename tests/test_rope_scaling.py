"""RoPE scaling variants against float64 references written from the published formulas.

The references below restate the definitions of transformers' `modeling_rope_utils.py`
(and the papers behind them) in plain float64 numpy, channel pair by channel pair; they
share no code with `keras_posenc`.
"""

import math

import keras
import numpy as np
import pytest
import tensorflow as tf
from attention_error import keras_attention_error
from float32_error import assert_within_bound, rotation_error

from keras_posenc import RotaryEmbedding, RotaryMultiHeadAttention

HEAD_DIM = 128
PAIRS = HEAD_DIM // 2


FREQUENCY_ERROR = 2.0**-44  # `RotaryEmbedding.inverse_frequencies`: float64, or two float32 words


def plain_omega(base: float, dim: int = HEAD_DIM) -> np.ndarray:
    return np.array([1.0 / base ** (2 * k / dim) for k in range(dim // 2)])


def llama3_omega(base, factor, low_freq_factor, high_freq_factor, original, dim=HEAD_DIM):
    out = []
    for w in plain_omega(base, dim):
        wavelength = 2 * math.pi / w
        if wavelength < original / high_freq_factor:
            out.append(w)
        elif wavelength > original / low_freq_factor:
            out.append(w / factor)
        else:
            smooth = (original / wavelength - low_freq_factor) / (
                high_freq_factor - low_freq_factor
            )
            out.append((1 - smooth) * w / factor + smooth * w)
    return np.array(out)


def yarn_omega_and_factor(
    base,
    factor,
    original,
    beta_fast=32,
    beta_slow=1,
    mscale=None,
    mscale_all_dim=None,
    truncate=True,
    dim=HEAD_DIM,
):
    def dim_for(rotations):
        return dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = dim_for(beta_fast), dim_for(beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    out = []
    for k, w in enumerate(plain_omega(base, dim)):
        ramp = min(max((k - low) / (high - low), 0.0), 1.0)
        out.append(w / factor * ramp + w * (1 - ramp))

    def m(scale, weight=1.0):
        return 1.0 if scale <= 1 else 0.1 * weight * math.log(scale) + 1.0

    attention = (
        m(factor, mscale) / m(factor, mscale_all_dim) if mscale and mscale_all_dim else m(factor)
    )
    return np.array(out), attention


def dynamic_omega(base, factor, max_positions, total_length, dim=HEAD_DIM):
    length = max(total_length, max_positions)
    grown = base * ((factor * length / max_positions) - (factor - 1)) ** (dim / (dim - 2))
    return plain_omega(grown, dim)


def rotate_half_reference(x, positions, omega, attention_factor=1.0):
    """float64 RoPE, half layout: pair k with k + D/2; x (batch, seq, heads, D)."""
    x = x.astype(np.float64)
    half = len(omega)
    angles = np.asarray(positions, np.float64)[..., None] * omega
    if angles.ndim == 2:
        angles = angles[None]
    cos = attention_factor * np.cos(angles)[:, :, None, :]
    sin = attention_factor * np.sin(angles)[:, :, None, :]
    first, second = x[..., :half], x[..., half : 2 * half]
    rotated = np.concatenate([first * cos - second * sin, second * cos + first * sin], -1)
    return np.concatenate([rotated, x[..., 2 * half :]], -1)


LLAMA31 = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}
DEEPSEEK_YARN = {
    "rope_type": "yarn",
    "factor": 40.0,
    "original_max_position_embeddings": 4096,
    "beta_fast": 32,
    "beta_slow": 1,
    "mscale": 1.0,
    "mscale_all_dim": 0.8,
}
SHORT = [1.0 + 0.02 * k for k in range(PAIRS)]
LONG = [1.0 + 0.5 * k for k in range(PAIRS)]
LONGROPE = {
    "rope_type": "longrope",
    "short_factor": SHORT,
    "long_factor": LONG,
    "original_max_position_embeddings": 4096,
    "max_position_embeddings": 131072,
}


def layer_for(scaling, base):
    layer = RotaryEmbedding(max_wavelength=base, scaling=scaling)
    layer.build((None, None, 2, HEAD_DIM))
    return layer


@pytest.mark.parametrize(
    "scaling, base, expected_omega, expected_factor",
    [
        (LLAMA31, 500000.0, llama3_omega(500000.0, 8.0, 1.0, 4.0, 8192), 1.0),
        (YARN, 1e6, *yarn_omega_and_factor(1e6, 4.0, 32768)),
        (DEEPSEEK_YARN, 10000.0, *yarn_omega_and_factor(10000.0, 40.0, 4096, 32, 1, 1.0, 0.8)),
        ({"rope_type": "linear", "factor": 2.0}, 10000.0, plain_omega(10000.0) / 2, 1.0),
        (
            LONGROPE,
            10000.0,
            plain_omega(10000.0) / np.array(SHORT),
            math.sqrt(1 + math.log(32) / math.log(4096)),
        ),
    ],
    ids=["llama3.1", "yarn-qwen", "yarn-deepseek", "linear", "longrope-short"],
)
def test_inverse_frequencies_and_outputs_match_the_definitions(
    scaling, base, expected_omega, expected_factor
):
    layer = layer_for(scaling, base)
    omega = layer.inverse_frequencies()
    # float64 frequencies: within the documented 2^-44 of the definition (far below float32's
    # 2^-24, so a frequency rounded through float32 fails).
    assert_within_bound(omega, expected_omega, FREQUENCY_ERROR * np.abs(expected_omega))

    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, (1, 64, 2, HEAD_DIM)).astype(np.float32)
    # Cached rows, and the exact path past them (longrope switches to its long factors
    # past 4096 in all: tested below).
    for start in (0, 3000) if scaling is LONGROPE else (0, 3000, 100_000):
        got = layer(x, start_index=start).numpy()
        want = rotate_half_reference(
            x, np.arange(start, start + 64), expected_omega, expected_factor
        )
        assert_within_bound(got, want, rotation_error(x, factor=expected_factor), what=start)


def test_longrope_chooses_factors_by_total_length_not_chunk_length():
    layer = layer_for(LONGROPE, 10000.0)
    factor = math.sqrt(1 + math.log(32) / math.log(4096))
    long_omega = plain_omega(10000.0) / np.array(LONG)
    short_omega = plain_omega(10000.0) / np.array(SHORT)
    np.testing.assert_allclose(layer.inverse_frequencies(5001), long_omega, rtol=1e-12)

    x = np.random.default_rng(1).uniform(-1, 1, (1, 1, 2, HEAD_DIM)).astype(np.float32)
    step = tf.function(lambda x, s: layer(x, start_index=s), jit_compile=True)
    for start, omega in ((5000, long_omega), (4095, short_omega), (4096, long_omega)):
        # The threshold is on the total length start + 1: 4096 is still short, 4097 long.
        want = rotate_half_reference(x, [start], omega, factor)
        for got in (layer(x, start_index=start), step(x, tf.constant(start))):
            assert_within_bound(got, want, rotation_error(x, factor=factor), what=start)


def test_dynamic_ntk_grows_the_base_with_the_total_length_in_the_graph():
    scaling = {"rope_type": "dynamic", "factor": 2.0, "max_position_embeddings": 256}
    layer = layer_for(scaling, 10000.0)
    x = np.random.default_rng(2).uniform(-1, 1, (1, 8, 2, HEAD_DIM)).astype(np.float32)
    graph = tf.function(lambda x, s: layer(x, start_index=s))
    jit = tf.function(lambda x, s: layer(x, start_index=s), jit_compile=True)
    for start in (0, 248, 500, 5000, 70_000):
        total = start + 8
        definition = dynamic_omega(10000.0, 2.0, 256, total)
        used = layer.inverse_frequencies(total)
        # The frequencies equal the definition within 2^-44 (two float32 words)...
        assert_within_bound(used, definition, FREQUENCY_ERROR * definition, what=total)
        # ...and the rotation is exact for the frequencies used.
        want = rotate_half_reference(x, np.arange(start, total), used)
        for got in (layer(x, start_index=start), graph(x, tf.constant(start))):
            assert_within_bound(got, want, rotation_error(x), what=start)
        # XLA forms exp/log with its own float32 rounding: compare with the definition
        # within what a 3e-7 relative change of the frequencies moves the angles.
        tolerance = 1e-6 + 3e-7 * total
        want = rotate_half_reference(x, np.arange(start, total), definition)
        assert np.abs(jit(x, tf.constant(start)).numpy() - want).max() <= tolerance, start


@pytest.mark.parametrize(
    "scaling, message",
    [
        ({"rope_type": "ntk-by-parts", "factor": 2.0}, "expected one of"),
        ({"rope_type": "llama3", "factor": 8.0}, "is missing"),
        ({"rope_type": "linear", "factor": 2.0, "beta": 1}, "unknown keys"),
        ({"rope_type": "linear", "factor": -2.0}, "must be > 0"),
        ({**LONGROPE, "long_factor": [1.0] * 3}, "list of 64 positive numbers"),
        ({"rope_type": "dynamic", "factor": 2.0}, "max_position_embeddings"),
        ({"rope_type": "yarn"}, "needs 'factor'"),
    ],
)
def test_bad_scaling_is_a_clear_error(scaling, message):
    with pytest.raises(ValueError, match=message):
        layer_for(scaling, 10000.0)


def test_scaling_survives_config_and_keras_file(tmp_path):
    inputs = keras.Input((None, 2, HEAD_DIM))
    outputs = RotaryEmbedding(scaling=LONGROPE, name="rope")(inputs)
    model = keras.Model(inputs, outputs)
    path = tmp_path / "rope.keras"
    model.save(path)
    loaded = keras.models.load_model(path)
    assert loaded.get_layer("rope").scaling == LONGROPE
    x = np.random.default_rng(4).uniform(-1, 1, (1, 5, 2, HEAD_DIM)).astype(np.float32)
    np.testing.assert_array_equal(loaded(x).numpy(), model(x).numpy())
    clone = RotaryEmbedding.from_config(model.get_layer("rope").get_config())
    assert clone.get_config() == model.get_layer("rope").get_config()


def test_left_padded_batch_rotates_real_tokens_as_unpadded():
    rng = np.random.default_rng(5)
    tokens = rng.integers(1, 50, (1, 6))
    padded = np.concatenate([np.zeros((1, 3), int), tokens], axis=1)  # three pads on the left
    embed = keras.layers.Embedding(50, 2 * 16, mask_zero=True)
    rope = RotaryEmbedding(positions_from_mask=True)

    def run(ids):
        heads = tf.reshape(embed(ids), (1, -1, 2, 16))
        return rope(heads, mask=embed.compute_mask(ids)).numpy()

    # RoPE is elementwise: a token at the same position gets the same float32 numbers.
    np.testing.assert_array_equal(run(padded)[:, 3:], run(tokens))


def test_rotary_attention_positions_from_mask_matches_unpadded():
    keras.utils.set_random_seed(1)
    embed = keras.layers.Embedding(50, 32, mask_zero=True)
    attention = RotaryMultiHeadAttention(num_heads=2, key_dim=16, positions_from_mask=True)
    tokens = np.random.default_rng(7).integers(1, 50, (1, 5))
    padded = np.concatenate([np.zeros((1, 2), int), tokens], axis=1)

    def run(ids):
        x = embed(ids)
        return attention(x, x, use_causal_mask=True).numpy()

    np.testing.assert_allclose(run(padded)[:, 2:], run(tokens), atol=1e-5)


def test_decoding_one_token_at_a_time_equals_the_full_causal_pass():
    """Token by token (query_start_index = t, keys 0..t) equals the full causal pass."""
    keras.utils.set_random_seed(0)
    embedding = keras.layers.Embedding(40, 32)
    attention = RotaryMultiHeadAttention(
        num_heads=2, key_dim=16, rotary_scaling={"rope_type": "linear", "factor": 2.0}
    )
    rope = RotaryEmbedding()
    ids = np.random.default_rng(6).integers(0, 40, (1, 12))
    states = embedding(ids)
    full = attention(states, states, use_causal_mask=True).numpy()
    full_rope = rope(tf.reshape(states, (1, 12, 2, 16))).numpy()

    @tf.function(jit_compile=True)
    def step(token_state, history, t):
        out = attention(token_state, history, query_start_index=t)
        return out, rope(tf.reshape(token_state, (1, 1, 2, 16)), start_index=t)

    # Each row of a step and of the full pass: within the bound of the same exact row.
    bound = 2 * keras_attention_error(attention, states.numpy(), causal=True)
    rope_bound = 2 * rotation_error(tf.reshape(states, (1, 12, 2, 16)).numpy())
    for t in range(12):
        token_state = states[:, t : t + 1]
        eager, eager_rope = (
            attention(token_state, states[:, : t + 1], query_start_index=t).numpy(),
            rope(tf.reshape(token_state, (1, 1, 2, 16)), start_index=t).numpy(),
        )
        compiled, compiled_rope = step(token_state, states[:, : t + 1], tf.constant(t))
        for got, got_rope in ((eager, eager_rope), (compiled.numpy(), compiled_rope.numpy())):
            row = slice(t, t + 1)
            assert_within_bound(got, full[:, row], bound[:, row], what=f"attention at {t}")
            assert_within_bound(got_rope, full_rope[:, row], rope_bound[:, row], what=f"RoPE {t}")


@pytest.mark.parametrize(
    "scaling, starts",
    [
        (LONGROPE, (0, 5000)),  # short factors, then long ones past 4096
        ({"rope_type": "dynamic", "factor": 2.0, "max_position_embeddings": 64}, (0, 100)),
        (YARN, (0, 5000)),
    ],
    ids=["longrope", "dynamic", "yarn"],
)
def test_scaling_exports_to_saved_model_and_onnx_and_verifies(tmp_path, scaling, starts):
    from keras_posenc import export

    heads = keras.Input((None, 2, HEAD_DIM), name="heads")
    start = keras.Input(batch_shape=(), dtype="int32", name="start_index")
    rotated = RotaryEmbedding(scaling=scaling, name="rope")(heads, start_index=start)
    model = keras.Model([heads, start], keras.layers.Identity(name="rotated")(rotated))
    export.save_saved_model(model, tmp_path / "saved_model")
    export.save_onnx(model, tmp_path / "model.onnx")
    for first in starts:

        def inputs(batch, sequence, first=first):
            rng = np.random.default_rng([batch, sequence])
            x = rng.uniform(-1, 1, (batch, sequence, 2, HEAD_DIM)).astype(np.float32)
            return {"heads": x, "start_index": np.array(first, np.int32)}

        report = export.verify_export(
            model,
            tmp_path / "saved_model",
            tmp_path / "model.onnx",
            batch_sizes=(1, 3),
            sequence_lengths=(1, 17),
            make_inputs=inputs,
            repeats=1,
        )
        assert report["passed"], report


# Issue 11 item 4: values a scaling dict must refuse, at construction, with a short message
# that names the key (before: silently used, or "can't multiply sequence by non-int",
# "math domain error", "unhashable type: 'list'").
YARN_DEEPSEEK = {**DEEPSEEK_YARN}
BAD_VALUES = [
    ({**YARN, "attention_factor": float("nan")}, "attention_factor"),
    ({**YARN, "attention_factor": float("inf")}, "attention_factor"),
    ({**YARN, "attention_factor": 0.0}, "attention_factor"),
    ({**YARN, "attention_factor": -1.0}, "attention_factor"),
    ({**YARN, "attention_factor": "1.0"}, "attention_factor"),
    ({**LONGROPE, "attention_factor": float("inf")}, "attention_factor"),
    ({**LONGROPE, "attention_factor": -0.5}, "attention_factor"),
    ({**YARN_DEEPSEEK, "mscale": float("nan")}, "mscale"),
    ({**YARN_DEEPSEEK, "mscale": -1.0}, "mscale"),
    ({**YARN_DEEPSEEK, "mscale_all_dim": float("inf")}, "mscale_all_dim"),
    ({"rope_type": "linear", "factor": float("inf")}, "factor"),
    ({"rope_type": "linear", "factor": 0}, "factor"),
    ({"rope_type": "dynamic", "factor": -2.0, "max_position_embeddings": 64}, "factor"),
    ({**LLAMA31, "low_freq_factor": float("inf")}, "low_freq_factor"),
    ({**LLAMA31, "high_freq_factor": 0.0}, "high_freq_factor"),
    ({**YARN, "factor": float("inf")}, "factor"),
    ({**YARN, "beta_fast": float("inf")}, "beta_fast"),
    ({**YARN, "beta_slow": -1}, "beta_slow"),
    ({**LLAMA31, "original_max_position_embeddings": 8192.5}, "original_max_position_embeddings"),
    ({**YARN, "original_max_position_embeddings": 4096.5}, "original_max_position_embeddings"),
    ({**LONGROPE, "original_max_position_embeddings": "4096"}, "original_max_position_embeddings"),
    ({**LONGROPE, "max_position_embeddings": 0}, "max_position_embeddings"),
    ({"rope_type": "dynamic", "factor": 2.0, "max_position_embeddings": 64.5}, "max_position"),
    # lists (and other types) where a number, a string or a bool belongs
    ({"rope_type": "linear", "factor": [2.0]}, "factor"),
    ({**YARN, "beta_fast": [32]}, "beta_fast"),
    ({**YARN_DEEPSEEK, "mscale": [1.0]}, "mscale"),
    ({**LLAMA31, "original_max_position_embeddings": [8192]}, "original_max_position"),
    ({**YARN, "rope_type": ["yarn"]}, "rope_type"),
    ({**YARN, "truncate": "no"}, "truncate"),
    ({**LONGROPE, "short_factor": "1.0"}, "short_factor"),
    ({**LONGROPE, "short_factor": [[1.0] * PAIRS]}, "short_factor"),
    ({**LONGROPE, "short_factor": [[1.0], [1.0, 2.0]] * (PAIRS // 2)}, "short_factor"),
    ({**LONGROPE, "short_factor": np.ones((PAIRS, 1))}, "short_factor"),
    ({**LONGROPE, "long_factor": ["1.0"] * PAIRS}, "long_factor"),
    ({**LONGROPE, "long_factor": [1.0] * (PAIRS - 1) + [float("nan")]}, "long_factor"),
    ({**LONGROPE, "long_factor": [1.0] * (PAIRS - 1) + [0.0]}, "long_factor"),
    ({**LONGROPE, "long_factor": [True] * PAIRS}, "long_factor"),
    ({**YARN, "type": "linear"}, "'type'"),
]


@pytest.mark.parametrize(
    "scaling, key", BAD_VALUES, ids=[f"{i}-{key}" for i, (_, key) in enumerate(BAD_VALUES)]
)
def test_bad_scaling_values_are_refused_at_construction(scaling, key):
    with pytest.raises(ValueError, match=key) as error:
        RotaryEmbedding(scaling=scaling)
    assert len(str(error.value)) < 400
    with pytest.raises(ValueError, match=key):
        RotaryEmbedding(rotary_dim=HEAD_DIM, scaling=scaling)


def test_messages_about_huge_lists_stay_short():
    huge = [1.0] * 10**6
    for scaling in (
        {**LONGROPE, "long_factor": huge},  # wrong length, found at build
        {**LONGROPE, "long_factor": huge[:-1] + ["x"]},  # wrong type, found at construction
        {"rope_type": "linear", "factor": huge},
    ):
        with pytest.raises(ValueError) as error:
            layer_for(scaling, 10000.0)
        assert len(str(error.value)) < 400, len(str(error.value))


def test_legacy_type_next_to_rope_type_is_accepted_when_they_agree():
    # transformers 5's to_dict() keeps both.
    both = {**LLAMA31, "type": "llama3"}
    layer = layer_for(both, 500000.0)
    assert layer.scaling == LLAMA31
    np.testing.assert_allclose(
        layer.inverse_frequencies(), llama3_omega(500000.0, 8.0, 1.0, 4.0, 8192), rtol=1e-12
    )


def test_longrope_factors_as_numpy_arrays_work_through_a_keras_file(tmp_path):
    scaling = {
        **LONGROPE,
        "short_factor": np.array(SHORT, np.float32),
        "long_factor": np.array(LONG),
        "original_max_position_embeddings": np.int64(4096),
        "max_position_embeddings": np.int32(131072),
    }
    inputs = keras.Input((None, 2, HEAD_DIM))
    outputs = RotaryEmbedding(scaling=scaling, name="rope")(inputs, start_index=5000)
    model = keras.Model(inputs, outputs)
    path = tmp_path / "rope.keras"
    model.save(path)
    loaded = keras.models.load_model(path)
    stored = loaded.get_layer("rope").scaling
    assert stored["long_factor"] == LONG and isinstance(stored["long_factor"][0], float)
    np.testing.assert_array_equal(stored["short_factor"], np.float32(SHORT).tolist())
    x = np.random.default_rng(8).uniform(-1, 1, (1, 3, 2, HEAD_DIM)).astype(np.float32)
    np.testing.assert_array_equal(loaded(x).numpy(), model(x).numpy())
    factor = math.sqrt(1 + math.log(32) / math.log(4096))
    want = rotate_half_reference(
        x, np.arange(5000, 5003), plain_omega(10000.0) / np.array(LONG), factor
    )
    assert_within_bound(loaded(x).numpy(), want, rotation_error(x, factor=factor))


def test_numpy_scalars_in_scaling_are_stored_as_plain_numbers(tmp_path):
    scaling = {"rope_type": "linear", "factor": np.float32(2.0)}
    inputs = keras.Input((None, 2, 16))
    model = keras.Model(inputs, RotaryEmbedding(scaling=scaling, name="rope")(inputs))
    model.save(tmp_path / "rope.keras")
    loaded = keras.models.load_model(tmp_path / "rope.keras")
    assert loaded.get_layer("rope").scaling == {"rope_type": "linear", "factor": 2.0}


# Issue 16: a transformers 5 `rope_parameters` dict is a valid `scaling` as it is. Its
# `rope_theta` must agree with max_wavelength (never replaces it silently); a
# `partial_rotary_factor` other than 1 is refused (the layer cannot see the head size).
def test_transformers5_rope_parameters_is_accepted_as_scaling():
    parameters = {**LLAMA31, "rope_theta": 500000.0, "partial_rotary_factor": 1.0}
    layer = layer_for(parameters, 500000.0)
    np.testing.assert_allclose(
        layer.inverse_frequencies(), llama3_omega(500000.0, 8.0, 1.0, 4.0, 8192), rtol=1e-12
    )
    x = np.random.default_rng(9).uniform(-1, 1, (1, 4, 2, HEAD_DIM)).astype(np.float32)
    np.testing.assert_array_equal(layer(x).numpy(), layer_for(LLAMA31, 500000.0)(x).numpy())
    default = layer_for({"rope_type": "default", "rope_theta": 10000.0}, 10000.0)
    np.testing.assert_allclose(default.inverse_frequencies(), plain_omega(10000.0), rtol=1e-12)
    clone = RotaryEmbedding.from_config(layer.get_config())
    assert clone.get_config() == layer.get_config()


@pytest.mark.parametrize(
    "parameters, message",
    [
        ({**LLAMA31, "rope_theta": 500000.0}, "max_wavelength=500000.0"),
        ({"rope_type": "default", "rope_theta": 1e6}, "max_wavelength=1000000.0"),
        ({"rope_type": "linear", "factor": 2.0, "partial_rotary_factor": 0.25}, "rotary_dim"),
        ({"rope_type": "linear", "factor": 2.0, "rope_theta": 0.0}, "rope_theta"),
    ],
)
def test_rope_parameters_disagreeing_with_the_layer_are_refused(parameters, message):
    with pytest.raises(ValueError, match=message):
        layer_for(parameters, 10000.0)
