"""transformers' `rope_type: "axial"` (2D vision RoPE) read into `RotaryEmbedding(axes_dims=...)`.

transformers 5.24 has it as the rope type of its vision encoders (Qwen3-VL, GLM-4V,
PaddleOCR-VL: `default_rope_type = "axial"`, each module's own
`compute_axial_rope_parameters`, not in `ROPE_INIT_FUNCTIONS`): `d/4` frequencies
`θ^(-2j/(d/2))`, the first half of the pairs turned by the row and the second by the column
(`cat([freq_h, freq_w])`, half layout). The parity tests run those modules side by side;
the formula is also restated in numpy float64. An unknown rope_type stays an error
wherever it is met, never read as another type.
"""

from __future__ import annotations

import numpy as np
import pytest
from float32_error import assert_within_bound, rotation_error, torch_table_error

from keras_posenc import RotaryEmbedding, grid_positions
from keras_posenc.rope import rope_parameters

# The layer is within a few float32 roundings of float64; transformers forms its angles in
# float32 (position · ω rounded, positions below 16 here).


def _axial_float64(x: np.ndarray, positions: np.ndarray, theta: float) -> np.ndarray:
    """transformers' axial rotation restated: `x (batch, seq, heads, d)`, positions `(seq, 2)`."""
    dim = x.shape[-1]
    spatial = dim // 2
    omega = 1.0 / theta ** (np.arange(0, spatial, 2, dtype=np.float64) / spatial)
    angles = np.concatenate([positions[:, :1] * omega, positions[:, 1:2] * omega], -1)
    cos = np.concatenate([np.cos(angles)] * 2, -1)[None, :, None, :]
    sin = np.concatenate([np.sin(angles)] * 2, -1)[None, :, None, :]
    half = dim // 2
    x = x.astype(np.float64)
    return x * cos + np.concatenate([-x[..., half:], x[..., :half]], -1) * sin


@pytest.mark.parametrize("family", ["qwen3_vl", "glm4v", "paddleocr_vl"])
def test_axial_configs_rotate_as_transformers(family):
    import torch

    if family == "qwen3_vl":
        from transformers.models.qwen3_vl import modeling_qwen3_vl as modeling
        from transformers.models.qwen3_vl.configuration_qwen3_vl import (
            Qwen3VLVisionConfig as Config,
        )

        rotary_class, apply = modeling.Qwen3VLVisionRotaryEmbedding, "apply_rotary_pos_emb_vision"
    elif family == "glm4v":
        from transformers.models.glm4v import modeling_glm4v as modeling
        from transformers.models.glm4v.configuration_glm4v import Glm4vVisionConfig as Config

        rotary_class, apply = modeling.Glm4vVisionRotaryEmbedding, "apply_rotary_pos_emb_vision"
    else:
        from transformers.models.paddleocr_vl import modeling_paddleocr_vl as modeling
        from transformers.models.paddleocr_vl.configuration_paddleocr_vl import (
            PaddleOCRVisionConfig as Config,
        )

        rotary_class = modeling.PaddleOCRVisionRotaryEmbedding
        apply = "apply_rotary_pos_emb_vision"
    config = Config(hidden_size=64, num_attention_heads=2, rope_parameters={"rope_theta": 100.0})
    assert config.rope_parameters["rope_type"] == "axial"
    positions = grid_positions(3, 5)
    q = np.random.default_rng(1).normal(size=(len(positions), 2, 32)).astype(np.float32)
    rotary = rotary_class(config)
    cos, sin = rotary(torch.tensor(q), torch.tensor(positions))  # (tokens, 2): row, column
    expected, _ = getattr(modeling, apply)(torch.tensor(q), torch.tensor(q), cos, sin)
    for given in (config, config.to_dict()):
        layer = RotaryEmbedding.from_transformers_config(given)
        assert (layer.axes_dims, layer.max_wavelength, layer.layout) == ((16, 16), 100.0, "half")
        rotated = np.asarray(layer(q[None], positions=positions))[0]
        # Ours and transformers' each within one float32 rotation of the exact (theirs
        # from float32 angles); ours within one rotation of the float64 formula.
        theirs = rotation_error(q, torch_table_error(positions.max()))
        assert_within_bound(rotated, expected.numpy(), rotation_error(q) + theirs)
        exact = _axial_float64(q[None], positions, 100.0)[0]
        assert_within_bound(rotated, exact, rotation_error(q))


def test_an_axial_config_of_any_model_type_is_read_by_its_rope_type():
    raw = {
        "model_type": "some_new_vision_tower",
        "hidden_size": 96,
        "num_heads": 4,
        "rope_parameters": {"rope_type": "axial", "rope_theta": 1e4},
    }
    layer = RotaryEmbedding.from_transformers_config(raw)
    assert layer.axes_dims == (12, 12)
    x = np.random.default_rng(2).normal(size=(1, 6, 4, 24)).astype(np.float32)
    positions = grid_positions(2, 3)
    exact = _axial_float64(x, positions, 1e4)
    assert_within_bound(layer(x, positions=positions), exact, rotation_error(x))


@pytest.mark.parametrize(
    ("parameters", "pattern"),
    [
        ({"rope_type": "axial", "rope_theta": 1e4, "factor": 2.0}, r"'factor'"),
        ({"rope_type": "axial", "rope_theta": 1e4, "partial_rotary_factor": 0.5}, r"whole head"),
    ],
)
def test_axial_configs_with_keys_it_does_not_read_are_refused(parameters, pattern):
    raw = {"model_type": "x_vision", "hidden_size": 64, "num_heads": 2}
    with pytest.raises(ValueError, match=pattern):
        RotaryEmbedding.from_transformers_config({**raw, "rope_parameters": parameters})


def test_axial_is_no_scaling_of_one_axis():
    # As a `scaling` it has no one-axis meaning: the error says how to get it.
    with pytest.raises(ValueError, match=r"axes_dims"):
        rope_parameters(16, 1e4, {"rope_type": "axial"})
    with pytest.raises(ValueError, match=r"axes_dims"):
        RotaryEmbedding(scaling={"rope_type": "axial"})(np.zeros((1, 2, 1, 16), np.float32))


def test_an_unknown_rope_type_is_an_error_not_another_type():
    with pytest.raises(ValueError, match=r"Unknown rope_type 'made_up'"):
        rope_parameters(16, 1e4, {"rope_type": "made_up"})
    with pytest.raises(ValueError, match=r"Unknown rope_type 'made_up'"):
        RotaryEmbedding.from_transformers_config(
            {
                "model_type": "llama",
                "hidden_size": 64,
                "num_attention_heads": 4,
                "rope_scaling": {"rope_type": "made_up", "factor": 2.0},
            }
        )
