"""Positions on grids: 2D/3D sinusoidal, axial RoPE and M-RoPE against float64 restatements.

The references restate MAE's `get_2d_sincos_pos_embed`, Qwen2-VL's chunked and Qwen3-VL's
interleaved M-RoPE frequency recomposition, FLUX-style axial RoPE and Qwen2-VL's
`get_rope_index`, each written from its source, in float64; transformers' own Qwen2-VL
and Qwen3-VL rotary modules are run side by side on tiny random configs.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
import reference
import tensorflow as tf
from float32_error import (
    TABLE_ERROR,
    U,
    assert_within_bound,
    position_sum_error,
    rotation_error,
    score_and_bound,
    torch_table_error,
)

from keras_posenc import (
    RotaryEmbedding,
    SinusoidalPositionalEncoding,
    grid_positions,
    multimodal_positions,
)

# One rotation of inputs in [-1, 1] (float32_error.rotation_error): 2 (TABLE_ERROR + 3u).
ROTARY_TOLERANCE = 2 * (TABLE_ERROR + 3 * U)

# --------------------------------------------------------------------------------------
# References


def _mae_1d(embed_dim: int, positions: np.ndarray) -> np.ndarray:
    # MAE's get_1d_sincos_pos_embed_from_grid.
    omega = np.arange(embed_dim // 2, dtype=np.float64) / (embed_dim / 2.0)
    omega = 1.0 / 10000**omega
    out = np.einsum("m,d->md", positions.reshape(-1).astype(np.float64), omega)
    return np.concatenate([np.sin(out), np.cos(out)], axis=1)


def _mae_2d(embed_dim: int, height: int, width: int) -> np.ndarray:
    # MAE's get_2d_sincos_pos_embed (a height x width grid): "here w goes first".
    grid = np.meshgrid(np.arange(width, dtype=np.float64), np.arange(height, dtype=np.float64))
    grid = np.stack(grid, axis=0).reshape([2, 1, height, width])
    emb_h = _mae_1d(embed_dim // 2, grid[0])
    emb_w = _mae_1d(embed_dim // 2, grid[1])
    return np.concatenate([emb_h, emb_w], axis=1)


def _rotate_by_pairs(x: np.ndarray, angles: np.ndarray, layout: str) -> np.ndarray:
    """Rotate every channel pair of `x` `(..., seq, heads, D)` by `angles` `(seq, D/2)`."""
    x = np.asarray(x, np.float64)
    half = x.shape[-1] // 2
    cos, sin = np.cos(angles)[:, None, :], np.sin(angles)[:, None, :]
    if layout == "half":
        a, b = x[..., :half], x[..., half:]
        return np.concatenate([a * cos - b * sin, b * cos + a * sin], -1)
    a, b = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2], out[..., 1::2] = a * cos - b * sin, b * cos + a * sin
    return out


def _axial_angles(positions: np.ndarray, axes_dims, base: float) -> np.ndarray:
    # FLUX's EmbedND: per axis its own frequencies, concatenated in axis order.
    parts = []
    for axis, dim in enumerate(axes_dims):
        omega = 1.0 / base ** (np.arange(0, dim, 2, dtype=np.float64) / dim)
        parts.append(positions[:, axis, None].astype(np.float64) * omega)
    return np.concatenate(parts, -1)


def _mrope_angles(positions: np.ndarray, section, interleaved: bool, dim: int) -> np.ndarray:
    # Qwen2-VL: freqs per axis with the 1D frequencies, split by section, chunk i takes axis
    # i % 3; Qwen3-VL: pairs 1, 4, 7, ... (< 3 section[1]) height, 2, 5, ... width.
    omega = 1.0 / 10000.0 ** (np.arange(0, dim, 2, dtype=np.float64) / dim)
    freqs = positions.T[:, :, None].astype(np.float64) * omega  # (3, seq, dim/2)
    if not interleaved:
        chunks = np.split(freqs, np.cumsum(section)[:-1], axis=-1)
        return np.concatenate([chunk[i % 3] for i, chunk in enumerate(chunks)], -1)
    result = freqs[0].copy()
    for axis, offset in enumerate((1, 2), start=1):
        index = slice(offset, section[axis] * 3, 3)
        result[..., index] = freqs[axis, ..., index]
    return result


def _get_rope_index(tokens) -> np.ndarray:
    # Qwen2-VL's get_rope_index for one sequence of ("text", n) / ("image", (t, h, w)).
    parts, start = [], 0
    for kind, size in tokens:
        if kind == "text":
            parts.append(np.tile(np.arange(size), (3, 1)) + start)
        else:
            t, h, w = size
            t_index = np.repeat(np.arange(t), h * w)
            h_index = np.tile(np.repeat(np.arange(h), w), t)
            w_index = np.tile(np.arange(w), t * h)
            parts.append(np.stack([t_index, h_index, w_index]) + start)
        start = parts[-1].max() + 1
    return np.concatenate(parts, axis=1).T


# --------------------------------------------------------------------------------------
# Coordinates


def test_grid_positions_are_row_major():
    np.testing.assert_array_equal(
        grid_positions(2, 3), [[r, c] for r in range(2) for c in range(3)]
    )
    video = grid_positions(2, 2, frames=3)
    assert video.shape == (12, 3) and video.dtype == np.int32
    np.testing.assert_array_equal(video[5], [1, 0, 1])
    with_class = grid_positions(2, 2, class_token=True)
    np.testing.assert_array_equal(with_class, [[0, 0], [1, 1], [1, 2], [2, 1], [2, 2]])


@pytest.mark.parametrize("bad", [0, -1, 2.5, True])
def test_grid_positions_refuse_bad_sizes(bad):
    with pytest.raises(ValueError, match="must be a positive integer"):
        grid_positions(bad, 3)


def test_multimodal_positions_are_qwen2_vls_rope_index():
    segments = [("text", 3), ("image", (1, 2, 3)), ("text", 2), ("image", (2, 2, 2)), ("text", 1)]
    np.testing.assert_array_equal(multimodal_positions(segments), _get_rope_index(segments))
    with pytest.raises(ValueError, match="needs a \\(t, h, w\\) grid"):
        multimodal_positions([("image", (2, 2))])
    with pytest.raises(ValueError, match="Unknown segment kind"):
        multimodal_positions([("audio", 3)])


# --------------------------------------------------------------------------------------
# 2D and 3D sinusoidal


def test_2d_concat_encoding_is_maes_table():
    height, width, embed_dim = 5, 7, 16
    layer = SinusoidalPositionalEncoding(axes=2, layout="concat")
    positions = grid_positions(height, width)[:, ::-1]  # MAE encodes (column, row)
    x = np.zeros((1, height * width, embed_dim), np.float32)
    expected = _mae_2d(embed_dim, height, width)
    assert_within_bound(layer(x, positions=positions)[0], expected, position_sum_error(x[0]))


@pytest.mark.parametrize("layout", ["interleaved", "concat"])
@pytest.mark.parametrize("axes", [2, 3])
def test_each_axis_is_its_own_1d_encoding(layout, axes):
    width = 12 * axes // 2 if axes == 3 else 16
    rng = np.random.default_rng(0)
    positions = rng.integers(0, 2**24, size=(2, 9, axes))
    x = rng.uniform(-1, 1, (2, 9, width)).astype(np.float32)
    layer = SinusoidalPositionalEncoding(axes=axes, layout=layout)
    expected = x + np.concatenate(
        [
            reference.sinusoidal(positions[..., a], width // axes, layout=layout)
            for a in range(axes)
        ],
        -1,
    )
    for mode in ("eager", "jit"):
        encode = (
            layer
            if mode == "eager"
            else tf.function(lambda x, p: layer(x, positions=p), jit_compile=True)
        )
        outputs = layer(x, positions=positions) if mode == "eager" else encode(x, positions)
        assert_within_bound(outputs, expected, position_sum_error(x), what=mode)


def test_2d_encoding_under_xla_with_dynamic_grid_sizes():
    layer = SinusoidalPositionalEncoding(axes=2)
    encode = tf.function(
        lambda x, p: layer(x, positions=p),
        input_signature=[tf.TensorSpec([None, None, 8]), tf.TensorSpec([None, 2], tf.int32)],
        jit_compile=True,
    )
    for height, width in ((2, 3), (4, 5)):
        positions = grid_positions(height, width)
        outputs = encode(tf.zeros((1, height * width, 8)), positions)
        expected = np.concatenate([reference.sinusoidal(positions[:, a], 4) for a in range(2)], -1)
        assert_within_bound(outputs[0], expected, position_sum_error(np.zeros(expected.shape)))


@pytest.mark.parametrize(
    ("arguments", "shape", "positions", "pattern"),
    [
        ({"axes": 2}, (1, 4, 6), grid_positions(2, 2), r"multiple of 4, got 6"),
        ({"axes": 2}, (1, 4, 8), None, r"needs positions of shape \(sequence, 2\)"),
        ({"axes": 2}, (1, 4, 8), np.zeros((4, 3), np.int32), r"shape \(sequence, 2\) or"),
        ({"axes": 2}, (1, 4, 8), np.zeros((5, 2), np.int32), r"cover 5 steps"),
        ({"axes": 2}, (1, 2, 8), -np.ones((2, 2), np.int32), r"must be >= 0"),
    ],
)
def test_2d_encoding_errors(arguments, shape, positions, pattern):
    layer = SinusoidalPositionalEncoding(**arguments)
    with pytest.raises(ValueError, match=pattern):
        layer(tf.zeros(shape), positions=positions)


# --------------------------------------------------------------------------------------
# Axial RoPE and M-RoPE


@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_axial_rope_is_the_formula(layout):
    axes_dims, base = (4, 8, 4), 100.0
    rng = np.random.default_rng(1)
    positions = rng.integers(0, 2**24, size=(6, 3))
    x = rng.uniform(-1, 1, (2, 6, 3, 16)).astype(np.float32)
    layer = RotaryEmbedding(axes_dims=axes_dims, max_wavelength=base, layout=layout)
    angles = _axial_angles(positions, axes_dims, base)
    expected = np.stack([_rotate_by_pairs(x[b], angles, layout) for b in range(2)])
    np.testing.assert_allclose(layer(x, positions=positions), expected, atol=ROTARY_TOLERANCE)


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_mrope_is_the_qwen_recomposition(interleaved, layout):
    section, dim = (2, 3, 3), 16
    positions = multimodal_positions([("text", 2), ("image", (2, 2, 3)), ("text", 3)])
    x = np.random.default_rng(2).uniform(-1, 1, (1, len(positions), 2, dim)).astype(np.float32)
    layer = RotaryEmbedding(mrope_section=section, mrope_interleaved=interleaved, layout=layout)
    angles = _mrope_angles(positions, section, interleaved, dim)
    expected = _rotate_by_pairs(x[0], angles, layout)[None]
    rotate = tf.function(lambda x, p: layer(x, positions=p), jit_compile=True)
    np.testing.assert_allclose(rotate(x, positions), expected, atol=ROTARY_TOLERANCE)


def test_mrope_of_text_alone_is_plain_rope():
    x = np.random.default_rng(3).uniform(-1, 1, (2, 5, 2, 16)).astype(np.float32)
    mrope = RotaryEmbedding(mrope_section=(2, 3, 3), mrope_interleaved=True)
    expected = reference.rotary(x, np.arange(4000, 4005))
    assert_within_bound(mrope(x, start_index=4000), expected, rotation_error(x))


def test_axial_scores_depend_only_on_the_offset_along_each_axis():
    layer = RotaryEmbedding(axes_dims=(8, 8))
    rng = np.random.default_rng(4)
    q, k = (rng.normal(size=(1, 1, 1, 16)).astype(np.float32) for _ in range(2))

    def score(query_at, key_at):
        rq = np.asarray(layer(q, positions=np.array([query_at])), np.float64)
        rk = np.asarray(layer(k, positions=np.array([key_at])), np.float64)
        return score_and_bound(q, k, rq, rk)

    (a, a_bound), (b, b_bound) = score([3, 5], [1, 2]), score([13, 105], [11, 102])
    assert_within_bound(a, b, a_bound + b_bound, what="shifted along both axes")
    (c, c_bound) = score([3, 5], [2, 1])
    assert (np.abs(a - c) > 10 * (a_bound + c_bound)).all()  # the axes' offsets swapped


@pytest.mark.parametrize(
    ("arguments", "pattern"),
    [
        ({"axes_dims": (4, 6), "rotary_dim": 8}, r"sum to 10, but 8 channels"),
        ({"axes_dims": (4, 3)}, r"positive even integers"),
        ({"axes_dims": (8,)}, r"two or more axes"),
        ({"mrope_section": (2, 2, 2), "rotary_dim": 8}, r"counts 6 channel pairs, but 8"),
        ({"mrope_section": (2, -1, 2)}, r"non-negative integers"),
        ({"axes_dims": (4, 4), "mrope_section": (2, 2)}, r"not both"),
        (
            {
                "mrope_section": (4, 2, 2),
                "scaling": {"rope_type": "dynamic", "factor": 2.0, "max_position_embeddings": 64},
                "rotary_dim": 16,
            },
            r"switches frequencies",
        ),
    ],
)
def test_multi_axis_rope_errors(arguments, pattern):
    with pytest.raises(ValueError, match=pattern):
        RotaryEmbedding(**arguments)(tf.zeros((1, 4, 2, 16)), positions=np.zeros((4, 3), int))


def test_axial_rope_needs_coordinates_of_its_axes():
    layer = RotaryEmbedding(axes_dims=(8, 8))
    with pytest.raises(ValueError, match=r"needs positions of shape \(sequence, 2\)"):
        layer(tf.zeros((1, 4, 2, 16)))
    with pytest.raises(ValueError, match=r"shape \(sequence, 2\) or \(batch, sequence, 2\)"):
        layer(tf.zeros((1, 4, 2, 16)), positions=np.zeros((4,), np.int32))


@pytest.mark.parametrize(
    ("layer", "width", "axes"),
    [
        (SinusoidalPositionalEncoding(axes=3, layout="concat"), 12, 3),
        (RotaryEmbedding(axes_dims=(4, 4), max_wavelength=77.0), 8, 2),
        (RotaryEmbedding(mrope_section=(2, 1, 1), mrope_interleaved=True), 8, 3),
    ],
    ids=["sinusoidal", "axial", "mrope"],
)
def test_multi_axis_layers_round_trip_through_keras_files(layer, width, axes, tmp_path):
    inputs = keras.Input((None, width))
    positions = keras.Input((None, axes), dtype="int32")
    outputs = layer(inputs, positions=positions)
    model = keras.Model([inputs, positions], keras.layers.Dense(2)(outputs))
    model.save(tmp_path / "axes.keras")
    loaded = keras.models.load_model(tmp_path / "axes.keras")
    x = np.random.default_rng(5).normal(size=(2, 6, width)).astype(np.float32)
    p = np.random.default_rng(6).integers(0, 50, size=(2, 6, axes)).astype(np.int32)
    np.testing.assert_array_equal(loaded([x, p]), model([x, p]))
    assert loaded.get_layer(layer.name).get_config() == layer.get_config()


# --------------------------------------------------------------------------------------
# transformers side by side


@pytest.mark.parametrize("family", ["qwen2_vl", "qwen3_vl"])
def test_mrope_equals_transformers(family):
    import torch

    if family == "qwen2_vl":
        from transformers.models.qwen2_vl import modeling_qwen2_vl as modeling
        from transformers.models.qwen2_vl.configuration_qwen2_vl import Qwen2VLTextConfig

        config = Qwen2VLTextConfig(
            hidden_size=64,
            num_attention_heads=2,
            num_key_value_heads=2,
            num_hidden_layers=1,
            rope_parameters={
                "rope_type": "default",
                "rope_theta": 10000.0,
                "mrope_section": [4, 6, 6],
            },
        )
        rotary = modeling.Qwen2VLRotaryEmbedding(config)
        interleaved = False
    else:
        from transformers.models.qwen3_vl import modeling_qwen3_vl as modeling
        from transformers.models.qwen3_vl.configuration_qwen3_vl import Qwen3VLTextConfig

        config = Qwen3VLTextConfig(
            hidden_size=64,
            num_attention_heads=2,
            num_key_value_heads=2,
            num_hidden_layers=1,
            head_dim=32,
            rope_parameters={
                "rope_type": "default",
                "rope_theta": 10000.0,
                "mrope_section": [6, 5, 5],
                "mrope_interleaved": True,
            },
        )
        rotary = modeling.Qwen3VLTextRotaryEmbedding(config)
        interleaved = True
    section = tuple(config.rope_parameters["mrope_section"])
    positions = multimodal_positions([("text", 3), ("image", (2, 3, 4)), ("text", 4)])
    q = np.random.default_rng(7).normal(size=(1, 2, len(positions), 32)).astype(np.float32)
    position_ids = torch.tensor(positions.T[:, None, :])  # (3, batch, sequence)
    cos, sin = rotary(torch.tensor(q), position_ids)
    expected, _ = modeling.apply_rotary_pos_emb(torch.tensor(q), torch.tensor(q), cos, sin)
    layer = RotaryEmbedding.from_transformers_config(config, sequence_axis=2, feature_axis=3)
    assert (layer.mrope_section, layer.mrope_interleaved) == (section, interleaved)
    bound = rotation_error(q) + rotation_error(q, torch_table_error(positions.max()))
    assert_within_bound(layer(q, positions=positions), expected.numpy(), bound)


def test_mrope_configs_are_read_in_every_format():
    from transformers import Qwen2VLConfig, Qwen3VLConfig

    # transformers 4's config.json of Qwen2-VL-7B: the sections under rope_scaling "mrope".
    raw = {
        "model_type": "qwen2_vl",
        "hidden_size": 3584,
        "num_attention_heads": 28,
        "rope_theta": 1000000.0,
        "max_position_embeddings": 32768,
        "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]},
    }
    expected = {
        "max_wavelength": 1e6,
        "layout": "half",
        "rotary_dim": None,
        "scaling": None,
        "mrope_section": (16, 24, 24),
        "mrope_interleaved": False,
    }
    read = RotaryEmbedding.from_transformers_config(raw)
    assert {key: getattr(read, key) for key in expected} == expected
    # transformers 5's composite configs, as objects and dicts; sections from the module.
    for config, section, interleaved in (
        (Qwen2VLConfig(), (16, 24, 24), False),
        (Qwen3VLConfig(), (24, 20, 20), True),
    ):
        for given in (config, config.to_dict()):
            layer = RotaryEmbedding.from_transformers_config(given)
            assert (layer.mrope_section, layer.mrope_interleaved) == (section, interleaved)
    with pytest.raises(ValueError, match="transformers ignores it"):
        RotaryEmbedding.from_transformers_config(
            {**raw, "rope_scaling": {**raw["rope_scaling"], "mrope_interleaved": True}}
        )


@pytest.mark.parametrize("model_type", ["qwen2_vl_text", "qwen2_5_vl_text", "qwen3_vl_text"])
def test_mrope_keys_a_config_leaves_out_get_transformers_defaults(model_type):
    import transformers

    from keras_posenc.configs.arguments import rotary_arguments

    # 128-channel heads: the default sections (64 pairs) fill them.
    raw = {"model_type": model_type, "hidden_size": 512, "num_attention_heads": 4}
    config = transformers.AutoConfig.for_model(**raw)
    assert rotary_arguments(raw) == rotary_arguments(config) == rotary_arguments(config.to_dict())
