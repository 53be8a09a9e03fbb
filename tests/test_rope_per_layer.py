"""`rope_per_layer` and per-layer-type reading: schedules, refusals and their messages.

What each family's layers are is checked against transformers in
tests/test_transformers_parity_2026.py; here, the config forms and mistakes it must name.
"""

from __future__ import annotations

import pytest

from keras_posenc import RotaryEmbedding, rope_per_layer
from keras_posenc.configs.arguments import attention_arguments, rotary_arguments
from keras_posenc.configs.families import FAMILIES
from keras_posenc.configs.language_model import head_size

SIZES = {"hidden_size": 256, "num_attention_heads": 4, "head_dim": 64}


def _nope(config):
    return [index for index, layer in enumerate(rope_per_layer(config)) if layer is None]


@pytest.mark.parametrize(
    "config, nope",
    [
        ({"model_type": "smollm3", "num_hidden_layers": 8}, [3, 7]),
        ({"model_type": "smollm3", "num_hidden_layers": 4, "no_rope_layer_interval": 2}, [1, 3]),
        ({"model_type": "llama4_text", "num_hidden_layers": 3, "no_rope_layers": []}, []),
        (
            {"model_type": "llama4_text", "num_hidden_layers": 4, "no_rope_layers": [0, 1, 1, 1]},
            [0],
        ),
        ({"model_type": "exaone4", "num_hidden_layers": 8}, [3, 7]),
        ({"model_type": "exaone4", "num_hidden_layers": 4, "sliding_window": None}, []),
        ({"model_type": "qwen3_next", "num_hidden_layers": 8}, [0, 1, 2, 4, 5, 6]),
        ({"model_type": "lfm2", "num_hidden_layers": 3, "full_attn_idxs": [1]}, [0, 2]),
        ({"model_type": "gemma4_text", "num_hidden_layers": 3}, []),
    ],
)
def test_layers_without_positions_follow_the_config_class_schedule(config, nope):
    assert _nope({**SIZES, **config}) == nope


def test_gemma4_layers_get_their_type_head_size_and_parameters():
    config = {**SIZES, "model_type": "gemma4_text", "num_hidden_layers": 6, "global_head_dim": 128}
    layers = rope_per_layer(config)
    assert [layer.scaling for layer in layers[:5]] == [None] * 5
    assert layers[5].scaling == {"rope_type": "proportional", "partial_rotary_factor": 0.25}
    assert (layers[0].max_wavelength, layers[5].max_wavelength) == (1e4, 1e6)
    # transformers 5's to_dict() gives the full-attention head size per layer index.
    as_dict = {**config, "per_layer_config": {"5": {"head_dim": 128}}}
    del as_dict["global_head_dim"]
    assert [r.get_config()["scaling"] for r in rope_per_layer(as_dict)] == [
        r.get_config()["scaling"] for r in layers
    ]
    with pytest.raises(ValueError, match="per layer type.*layer_type="):
        rotary_arguments(config)


@pytest.mark.parametrize(
    "config, layer_type, message",
    [
        ({"model_type": "exaone4"}, "full_attention", "'full_attention' use no RoPE"),
        ({"model_type": "qwen3_next"}, "linear_attention", "'linear_attention' use no RoPE"),
        ({"model_type": "lfm2", "layer_types": ["conv", "full_attention"] * 2}, "conv", "no RoPE"),
        ({"model_type": "gpt_oss", "num_hidden_layers": 2}, "chunked", "not a layer type"),
    ],
)
def test_a_layer_type_without_rope_is_refused_naming_rope_per_layer(config, layer_type, message):
    config = {**SIZES, "num_hidden_layers": 4, **config}
    with pytest.raises(ValueError, match=message):
        RotaryEmbedding.from_transformers_config(config, layer_type=layer_type)


@pytest.mark.parametrize(
    "config, message",
    [
        ({"model_type": "smollm3", "no_rope_layers": [1, 1]}, "has 2 entries for 4 layers"),
        ({"model_type": "smollm3", "no_rope_layers": [1, 2, 1, 1]}, "0 / 1 per layer"),
        ({"model_type": "smollm3", "layer_types": ["full_attention"]}, "1 entries for num_hidden"),
        ({"model_type": "lfm2_moe"}, "needs 'layer_types'"),
        ({"model_type": "llama", "num_hidden_layers": None}, "needs 'num_hidden_layers'"),
        ({"model_type": "deepseek_v32", "rope_interleave": False}, "always interleaves"),
    ],
)
def test_bad_schedules_are_clear_errors(config, message):
    with pytest.raises(ValueError, match=message) as error:
        rope_per_layer({**SIZES, "num_hidden_layers": 4, **config})
    assert len(str(error.value)) < 400


def test_deepseek_v4_is_refused_saying_why():
    config = {**SIZES, "model_type": "deepseek_v4", "num_hidden_layers": 2}
    for read in (rope_per_layer, RotaryEmbedding.from_transformers_config):
        with pytest.raises(ValueError, match="DeepSeek-V4 rotates its compressed key/value"):
            read(config)


def test_minimax_m2_rotary_dim_is_its_rotated_channels():
    config = {**SIZES, "model_type": "minimax_m2", "rotary_dim": 32}
    assert rotary_arguments(config)["rotary_dim"] == 32
    # A top-level partial_rotary_factor wins, as MiniMaxM2Config's setdefault.
    assert rotary_arguments({**config, "partial_rotary_factor": 0.25})["rotary_dim"] == 16


def test_hunyuan_alpha_is_a_fixed_base():
    scaling = {"type": "dynamic", "alpha": 1000.0, "factor": 1.0}
    arguments = rotary_arguments(
        {**SIZES, "model_type": "hunyuan_v1_dense", "rope_scaling": scaling}
    )
    assert arguments["scaling"] is None
    assert arguments["max_wavelength"] == pytest.approx(1e4 * 1000.0 ** (64 / 62), rel=1e-15)


def test_gemma4_layer_types_have_their_own_head_size_and_its_attention_is_refused():
    config = {**SIZES, "model_type": "gemma4_text", "num_hidden_layers": 6, "global_head_dim": 128}
    gemma4 = FAMILIES["gemma4_text"]
    assert head_size(config, gemma4, "sliding_attention") == 64
    assert head_size(config, gemma4, "full_attention") == 128
    with pytest.raises(ValueError, match="keys as values"):
        attention_arguments({**config, "attention_k_eq_v": True}, "full_attention")
    # Its attention normalizes the values too (v_norm), which the layers do not.
    for layer_type in ("sliding_attention", "full_attention"):
        with pytest.raises(ValueError, match="gemma4_text config normalizes.*v_norm"):
            attention_arguments(config, layer_type)
