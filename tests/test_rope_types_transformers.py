"""Every yarn key and `proportional` against transformers' own `ROPE_INIT_FUNCTIONS`.

The config is read by `rotary_arguments`; the frequencies and attention factor
`rope_parameters` makes from its `scaling` must be those transformers' function makes from the
config object (float32 in transformers: rtol 2e-6, as tests/test_transformers_parity.py).
"""

from __future__ import annotations

import numpy as np
import pytest
import transformers
from float32_error import assert_within_bound, rotation_error, torch_frequency_error
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from keras_posenc import RotaryEmbedding
from keras_posenc.configs.arguments import rotary_arguments
from keras_posenc.rope import rope_parameters

SIZES = {"hidden_size": 128, "num_attention_heads": 4, "max_position_embeddings": 4096}
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 512}  # 4096/512 = 8
YARN_CASES = {
    "factor only": {},
    "truncate false (GPT-OSS)": {"truncate": False},
    "truncate true": {"truncate": True},
    "attention_factor": {"attention_factor": 0.7},
    "mscale and mscale_all_dim (DeepSeek)": {"mscale": 1.0, "mscale_all_dim": 0.707},
    "mscale alone is unused": {"mscale": 2.0},
    "beta_fast / beta_slow": {"beta_fast": 16.0, "beta_slow": 2.0},
    "beta null means the default": {"beta_fast": None, "beta_slow": None},
    "factor from the lengths": {"factor": None},
    "factor below 1 has no mscale": {"factor": 0.5},
    "every key": {
        "attention_factor": 1.1,
        "beta_fast": 24.0,
        "beta_slow": 0.5,
        "mscale": 1.0,
        "mscale_all_dim": 1.0,
        "truncate": False,
    },
}


def _compare(raw, model_type_init):
    arguments = rotary_arguments(raw)
    config = transformers.AutoConfig.for_model(**raw)
    head_dim = config.head_dim if getattr(config, "head_dim", None) else 32
    rotary_dim = arguments["rotary_dim"] or head_dim
    ours = rope_parameters(rotary_dim, arguments["max_wavelength"], arguments["scaling"])
    theirs, attention_factor = ROPE_INIT_FUNCTIONS[model_type_init](config, "cpu")
    theirs = theirs.double().numpy()
    assert_within_bound(ours.inverse_frequencies, theirs, torch_frequency_error(theirs, True))
    assert ours.attention_factor == pytest.approx(attention_factor, rel=1e-12)
    return ours


@pytest.mark.parametrize("name", sorted(YARN_CASES))
def test_every_yarn_key_equals_transformers(name):
    raw = {"model_type": "llama", **SIZES, "rope_parameters": {**YARN, **YARN_CASES[name]}}
    _compare(raw, "yarn")


def test_yarn_truncate_changes_the_frequencies():
    """A check that the cases above can tell truncate apart (GPT-OSS's false is not a no-op)."""
    by_truncate = [
        rope_parameters(32, 10000.0, {**YARN, "truncate": truncate}).inverse_frequencies
        for truncate in (True, False)
    ]
    assert np.abs(by_truncate[0] - by_truncate[1]).max() > 1e-4


def test_yarn_with_partial_rotary_equals_transformers():
    """GLM-4-MoE rotates half of each head: yarn's ramp is over the rotated channels."""
    raw = {
        "model_type": "glm4_moe",
        **SIZES,
        "head_dim": 32,
        "partial_rotary_factor": 0.5,
        "rope_scaling": {**YARN, "truncate": False},
    }
    assert rotary_arguments(raw)["rotary_dim"] == 16
    _compare(raw, "yarn")


@pytest.mark.parametrize(
    "parameters",
    [
        {"partial_rotary_factor": 0.25},
        {"partial_rotary_factor": 0.3},  # int(0.3 * 32 // 2) = 4 of 16 pairs turn
        {"partial_rotary_factor": 1.0},
        {"partial_rotary_factor": 0.5, "factor": 4.0},
    ],
)
def test_proportional_equals_transformers(parameters):
    raw = {
        "model_type": "gemma4_text",
        **SIZES,
        "head_dim": 16,
        "global_head_dim": 32,
        "num_hidden_layers": 2,
        "layer_types": ["sliding_attention", "full_attention"],
        "rope_parameters": {
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": {"rope_type": "proportional", "rope_theta": 1e6, **parameters},
        },
    }
    arguments = rotary_arguments(raw, "full_attention")
    assert arguments["rotary_dim"] is None  # the whole head, with some frequencies zero
    config = transformers.AutoConfig.for_model(**raw)
    layer_config = config.per_layer_config[1]
    theirs, attention_factor = ROPE_INIT_FUNCTIONS["proportional"](
        layer_config, "cpu", layer_type="full_attention"
    )
    ours = rope_parameters(32, arguments["max_wavelength"], arguments["scaling"])
    theirs = theirs.double().numpy()
    assert_within_bound(ours.inverse_frequencies, theirs, torch_frequency_error(theirs, True))
    assert ours.attention_factor == attention_factor == 1.0


def test_proportional_rotation_leaves_the_zero_frequency_pairs_unchanged():
    """Against the definition in float64: pair k (with k + 8 of 16) turns at 1e6^(-2k/16)."""
    scaling = {"rope_type": "proportional", "partial_rotary_factor": 0.5}
    layer = RotaryEmbedding(max_wavelength=1e6, scaling=scaling)
    x = np.random.default_rng(0).normal(size=(1, 5, 2, 16)).astype(np.float32)
    positions = np.arange(3000, 3005, dtype=np.float64)
    omega = 1e6 ** (-np.arange(0, 16, 2) / 16.0)
    omega[4:] = 0.0
    angle = positions[:, None] * omega  # (5, 8)
    cos, sin = np.cos(angle)[None, :, None], np.sin(angle)[None, :, None]
    first, second = x[..., :8].astype(np.float64), x[..., 8:].astype(np.float64)
    expected = np.concatenate([first * cos - second * sin, second * cos + first * sin], -1)
    ours = layer(x, start_index=3000).numpy()
    assert_within_bound(ours, expected, rotation_error(x))
    np.testing.assert_array_equal(ours[..., 4:8], x[..., 4:8])  # zero-frequency pairs
    np.testing.assert_array_equal(ours[..., 12:], x[..., 12:])


def test_proportional_keeps_its_fraction_and_other_types_still_refuse_one():
    layer = RotaryEmbedding(scaling={"rope_type": "proportional", "partial_rotary_factor": 0.25})
    assert RotaryEmbedding.from_config(layer.get_config()).scaling == layer.scaling
    with pytest.raises(ValueError, match="cannot apply a fraction"):
        RotaryEmbedding(
            scaling={"rope_type": "linear", "factor": 2.0, "partial_rotary_factor": 0.5}
        )
