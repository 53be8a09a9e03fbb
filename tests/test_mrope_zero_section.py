"""M-RoPE sections holding a 0 (small Qwen3.5 / Qwen2-VL configs), read as transformers reads them.

transformers' Qwen2-VL splits cos/sin into chunks of the section's sizes (an empty chunk for
a 0) and Qwen3.5 / Qwen3-VL overwrite pairs `offset::3` below `3 · section[axis]` (none for a
0): both run such configs. The layer must give the same rotation, side by side with
transformers' own rotary modules on tiny configs, and keep one coordinate per axis of the
section (an axis with no pairs still has its column in the positions).
"""

from __future__ import annotations

import numpy as np
import pytest
from float32_error import assert_within_bound, rotation_error, torch_table_error

from keras_posenc import RotaryEmbedding, multimodal_positions

# Each value is within a few float32 roundings of the float64 rotation; transformers forms
# its angles in float32 (position · ω rounded: about 2^-24 · 40 for the positions here).


def _transformers_rotation(family: str, section: list[int], q: np.ndarray, positions):
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
                "mrope_section": section,
            },
        )
        rotary = modeling.Qwen2VLRotaryEmbedding(config)
    else:
        from transformers.models.qwen3_5 import modeling_qwen3_5 as modeling
        from transformers.models.qwen3_5.configuration_qwen3_5 import Qwen3_5TextConfig

        config = Qwen3_5TextConfig(
            hidden_size=64,
            num_attention_heads=2,
            num_key_value_heads=2,
            num_hidden_layers=1,
            head_dim=32,
            rope_parameters={
                "rope_type": "default",
                "rope_theta": 10000.0,
                "partial_rotary_factor": 1.0,
                "mrope_section": section,
                "mrope_interleaved": True,
            },
        )
        rotary = modeling.Qwen3_5TextRotaryEmbedding(config)
    position_ids = torch.tensor(positions.T[:, None, :])  # (3, batch, sequence)
    cos, sin = rotary(torch.tensor(q), position_ids)
    expected, _ = modeling.apply_rotary_pos_emb(torch.tensor(q), torch.tensor(q), cos, sin)
    return config, expected.numpy()


@pytest.mark.parametrize(
    ("family", "section"),
    [
        ("qwen2_vl", [0, 8, 8]),
        ("qwen2_vl", [8, 8, 0]),
        ("qwen3_5", [8, 8, 0]),
        ("qwen3_5", [16, 0, 0]),
        ("qwen3_5", [6, 0, 10]),
    ],
)
def test_a_zero_in_the_section_rotates_as_transformers(family, section):
    positions = multimodal_positions([("text", 3), ("image", (2, 3, 4)), ("text", 4)])
    q = np.random.default_rng(3).normal(size=(1, 2, len(positions), 32)).astype(np.float32)
    config, expected = _transformers_rotation(family, section, q, positions)
    layer = RotaryEmbedding.from_transformers_config(config, sequence_axis=2, feature_axis=3)
    assert layer.mrope_section == tuple(section)
    # Ours and transformers' (float32 angles) each within one float32 rotation of the exact.
    bound = rotation_error(q) + rotation_error(q, torch_table_error(positions.max()))
    assert_within_bound(layer(q, positions=positions), expected, bound)


def test_an_axis_without_pairs_keeps_its_column():
    # The section has three axes: positions of three columns, whose last one turns nothing.
    layer = RotaryEmbedding(mrope_section=(4, 4, 0))
    x = np.random.default_rng(4).normal(size=(1, 5, 2, 16)).astype(np.float32)
    positions = np.random.default_rng(5).integers(0, 100, size=(5, 3)).astype(np.int32)
    moved = positions.copy()
    moved[:, 2] += 17
    np.testing.assert_array_equal(layer(x, positions=positions), layer(x, positions=moved))
    with pytest.raises(ValueError, match=r"\(sequence, 3\)"):
        layer(x, positions=positions[:, :2])


@pytest.mark.parametrize(
    ("section", "pattern"),
    [((0, 0, 0), r"at least one"), ((4, -1, 5), r"non-negative"), ((4.0, 4, 0), r"integers")],
)
def test_sections_transformers_cannot_run_are_still_refused(section, pattern):
    with pytest.raises(ValueError, match=pattern):
        RotaryEmbedding(mrope_section=section)
