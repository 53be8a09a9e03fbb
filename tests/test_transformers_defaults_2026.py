"""The 2026 families read as transformers reads what a config leaves out or adds.

A `config.json` with only sizes reads as the family's config class fills it in (layer types and
NoPE schedules included), in every form; a top-level `partial_rotary_factor` is read as the
family's attention reads it (ignored by whole-head families, applied by the others), checked on
the tiny models of tests/test_transformers_parity_2026.py; Qwen3.5's M-RoPE on image positions.
"""

from __future__ import annotations

import importlib

import numpy as np
import pytest
import torch
import transformers
from float32_error import assert_within_bound, rotation_error, torch_table_error
from test_transformers_parity_2026 import CASES, LENGTH, SIZES, LayerCapture, _described, _numpy

from keras_posenc import rope_per_layer
from keras_posenc.configs.arguments import attention_arguments, rotary_arguments
from keras_posenc.configs.families import COMPOSITE_5, FAMILIES

_ROPE_KEYS = (
    "rope_scaling",
    "rope_parameters",
    "rope_theta",
    "rotary_dim",
    "layer_types",
    "full_attention_interval",
)
# Config-class defaults that make no working transformers model with a top-level
# partial_rotary_factor: their scaled frequencies read it, their attention does not.
_SCALED_BY_DEFAULT = {"gpt_oss", "apertus"}


def _without_rope_keys(case):
    raw = {"model_type": case.model_type, **SIZES}
    raw.update({k: v for k, v in case.raw.items() if k not in _ROPE_KEYS})
    return raw


@pytest.mark.parametrize("name", sorted(CASES))
def test_keys_a_config_leaves_out_get_transformers_defaults(name):
    """Sizes only (no RoPE keys, no layer_types, no head_dim): read as the config class fills in."""
    raw = _without_rope_keys(CASES[name])
    del raw["head_dim"]
    raw["num_hidden_layers"] = 8
    config = transformers.AutoConfig.for_model(**raw)
    if raw["model_type"] == "lfm2_moe":  # its class makes no layer_types: its model fails
        with pytest.raises(ValueError, match="needs 'layer_types'"):
            rope_per_layer(raw)
        return
    forms = [raw, config, config.to_dict()]
    text = raw["model_type"].removesuffix("_text")
    if text in COMPOSITE_5:  # the multimodal config.json holds the same under text_config
        forms.append({"model_type": text, "text_config": raw})
    described = [_described(rope_per_layer(form)) for form in forms]
    assert all(d == described[0] for d in described), described
    types = getattr(config, "layer_types", None) or [None] * 8
    for layer_type in sorted(set(types), key=str):
        layers = [r for t, r in zip(types, rope_per_layer(raw), strict=True) if t == layer_type]
        if layers and layers[0] is not None:
            assert rotary_arguments(raw, layer_type) == rotary_arguments(config, layer_type)
            family = FAMILIES[raw["model_type"]]
            if family.mrope is None and raw["model_type"] != "deepseek_v32":  # layers take them
                # By index: SmolLM3's full_attention layers are RoPE and NoPE ones.
                index = types.index(layer_type)
                # Gemma 4's value norm and GPT-OSS's sinks: refused.
                if raw["model_type"] in ("gemma4_text", "gpt_oss"):
                    for form in (raw, config):
                        with pytest.raises(ValueError, match="v_norm|sinks"):
                            attention_arguments(form, layer_index=index)
                    continue
                ours = attention_arguments(raw, layer_index=index)
                assert ours == attention_arguments(config, layer_index=index)
                # The q/k norm and its epsilon are the config class's defaults in both forms.
                norm = family.norm
                if norm is not None and norm.flag is None:
                    assert ours["query_key_norm"] == norm.kind
                    epsilon = getattr(config, norm.epsilon_key)
                    assert ours["query_key_norm_epsilon"] == epsilon == norm.epsilon


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_top_level_partial_rotary_factor_is_read_as_transformers_reads_it(name):
    """Whole-head families ignore it, others rotate that part of the head, as transformers."""
    case = CASES[name]
    raw = {**_without_rope_keys(case), "partial_rotary_factor": 0.5}
    schedule = ("layer_types", "num_hidden_layers", "full_attention_interval")
    raw.update({k: v for k, v in case.raw.items() if k in schedule})
    if case.model_type in _SCALED_BY_DEFAULT:
        with pytest.raises(ValueError, match="partial_rotary_factor.*remove it"):
            rope_per_layer(raw)
        return
    if FAMILIES[case.model_type].mrope is not None:
        # Its default mrope_section no longer fits the rotated channels: refused (the
        # transformers model runs on text, where every axis has the same position).
        with pytest.raises(ValueError, match="mrope_section.*channel pairs"):
            rope_per_layer(raw)
        return
    config = transformers.AutoConfig.for_model(**raw)
    torch.manual_seed(0)
    model = transformers.AutoModel.from_config(config, attn_implementation="eager").eval()
    ids = torch.tensor(np.random.default_rng(0).integers(1, 64, (1, LENGTH)))
    with LayerCapture(model, case.function) as capture, torch.no_grad():
        model(input_ids=ids, use_cache=False)
    layers = rope_per_layer(raw)
    assert sorted(capture.calls) == [i for i in range(len(layers)) if layers[i] is not None]
    for index, pairs in capture.calls.items():
        for pre, post in pairs:
            pre, post = _numpy(pre, case.sequence_axis), _numpy(post, case.sequence_axis)
            ours = layers[index](pre).numpy()
            if case.deinterleaved_output:
                ours = np.concatenate([ours[..., 0::2], ours[..., 1::2]], -1)
            # Some cases scale their RoPE (llama3, YaRN, dynamic NTK): `scaled` for all.
            theirs = torch_table_error(LENGTH - 1, scaled=True)
            bound = rotation_error(pre) + rotation_error(pre, theirs)
            assert_within_bound(ours, post, bound)


@pytest.mark.parametrize("module", ["qwen3_5", "qwen3_5_moe"])
def test_qwen3_5_multimodal_positions_equal_transformers(module):
    """Qwen3.5's interleaved M-RoPE on a quarter of each head, on image positions."""
    from keras_posenc import multimodal_positions

    modeling = importlib.import_module(f"transformers.models.{module}.modeling_{module}")
    raw = {
        "model_type": f"{module}_text",
        **SIZES,
        "head_dim": 64,
        "num_hidden_layers": 4,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 1e7,
            "partial_rotary_factor": 0.25,
            "mrope_section": [3, 3, 2],
            "mrope_interleaved": True,
        },
    }
    config = transformers.AutoConfig.for_model(**raw)
    rotary_class = next(
        getattr(modeling, name) for name in dir(modeling) if name.endswith("TextRotaryEmbedding")
    )
    rotary = rotary_class(config)
    positions = multimodal_positions([("text", 3), ("image", (2, 3, 4)), ("text", 4)])
    q = np.random.default_rng(7).normal(size=(1, 2, len(positions), 64)).astype(np.float32)
    position_ids = torch.tensor(positions.T[:, None, :])  # (3, batch, sequence)
    cos, sin = rotary(torch.tensor(q), position_ids)
    expected, _ = modeling.apply_rotary_pos_emb(torch.tensor(q), torch.tensor(q), cos, sin)
    layer = rope_per_layer(raw, sequence_axis=2, feature_axis=3)[3]
    assert (layer.rotary_dim, layer.mrope_section) == (16, (3, 3, 2))
    bound = rotation_error(q) + rotation_error(q, torch_table_error(positions.max()))
    assert_within_bound(layer(q, positions=positions), expected.numpy(), bound)
