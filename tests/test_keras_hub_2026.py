"""SmolLM3 and Gemma 4 (keras_hub 0.32's 2026 families) through `save_decoder`, against keras_hub.

As tests/test_keras_hub_export.py does for the earlier families: each tiny random model
(`keras_hub_models.FAMILIES_2026`: SmolLM3 with a NoPE layer and q/k/v biases; Gemma 4's
dense text decoder with local and global layers, proportional RoPE on the global ones,
K = V, value norms, `layer_scalar`s and a final soft cap) is exported and must generate
keras_hub's greedy tokens over 64 steps, batch 1 and a left-padded batch 4, logits within
1e-5 + 1e-4·|x|, in the GroupQueryAttention graph, the LiteRT file and the standard-op
graph. What each family adds is checked to matter (dropped, the tokens change), the
proportional tables against numpy's float64 angles, the reference against Gemma 4's own
`generate()` (its generate step differs from the other families'), the refusals, and
`rebuild` (SmolLM3's NoPE layer as a `DecoderBlock` with `rope_dim=0`, exported in turn).
"""

from __future__ import annotations

import dataclasses
import functools

import keras
import numpy as np
import onnxruntime
import pytest
from keras_hub_models import (
    FAMILIES_2026,
    GENAI,
    MAX_LENGTH,
    VOCABULARY,
    assert_greedy_is_generate,
    tiny_causal_lm_2026,
)

from keras_posenc.export import save_decoder
from keras_posenc.export.decoder import compare_greedy, decoder_cases, decoder_onnx, onnx_greedy
from keras_posenc.export.decoder.greedy_generation import keras_greedy
from keras_posenc.export.decoder.keras_reader import describe_decoder
from keras_posenc.export.errors import ExportError
from keras_posenc.keras_hub import FAMILIES, describe_causal_lm, keras_hub_greedy, rebuild
from keras_posenc.layers.decoder_block import DecoderBlock

_tiny = functools.cache(tiny_causal_lm_2026)


def _passed(report, runtimes, windowed: bool):
    assert report["passed"]
    assert [case["steps"] for case in report["cases"]][:2] == [64, 64]
    # A windowed family (Gemma 4) also runs past its window.
    names = [case["name"] for case in report["cases"]][2:-1]  # the last: teacher-forced
    assert [name.startswith("batch 2 past the window") for name in names] == [True] * windowed
    for case in report["cases"]:
        # og.Model on the folder too, where onnxruntime-genai is installed.
        assert sorted(case["runtimes"]) == sorted(runtimes + GENAI)
        for result in case["runtimes"].values():
            assert result["same_tokens"] and result["within_tolerance"], (case["name"], result)


@pytest.mark.parametrize("family", list(FAMILIES_2026))
def test_export_generates_as_keras_hub(tmp_path, family):
    report = save_decoder(
        _tiny(family), tmp_path / "out", max_length=MAX_LENGTH, formats=("onnx", "litert")
    )
    _passed(report, ["onnxruntime", "litert"], windowed=family == "gemma4")
    assert (tmp_path / "out" / "model.tflite").exists()


@pytest.mark.parametrize("family", list(FAMILIES_2026))
def test_standard_graph_generates_as_keras_hub(tmp_path, family):
    report = save_decoder(
        _tiny(family), tmp_path / "out", max_length=MAX_LENGTH, attention="standard"
    )
    _passed(report, ["onnxruntime"], windowed=family == "gemma4")


def _onnx_run(decoder, case):
    session = onnxruntime.InferenceSession(
        decoder_onnx(decoder).SerializeToString(), providers=["CPUExecutionProvider"]
    )
    return onnx_greedy(session, case["prompts"], case["mask"], case["steps"], MAX_LENGTH)


def _changed(decoder, block_changes=None, **attention_changes):
    blocks = tuple(
        dataclasses.replace(
            block,
            attention=dataclasses.replace(block.attention, **attention_changes),
            **(block_changes or {}),
        )
        for block in decoder.blocks
    )
    return dataclasses.replace(decoder, blocks=blocks)


@pytest.mark.parametrize(
    "family, attention_changes, block_changes",
    [
        ("smollm3", {"no_rope": False}, None),  # the NoPE layer rotated as the others
        ("gemma4", {"value_norm": None}, None),
        ("gemma4", {"rope": None}, None),  # the global layers' proportional tables: the local ones
        ("gemma4", {}, {"output_scale": 1.0}),  # the layer_scalars
        ("gemma4", {"window": None}, None),
    ],
)
def test_each_setting_matters(family, attention_changes, block_changes):
    causal_lm = _tiny(family)
    case = {**decoder_cases(VOCABULARY, MAX_LENGTH)[1], "steps": 24}  # positions past 16
    expected = keras_hub_greedy(causal_lm)(case["prompts"], case["mask"], case["steps"])
    decoder = describe_causal_lm(causal_lm, MAX_LENGTH)
    assert compare_greedy(expected, _onnx_run(decoder, case), case["mask"])["passed"]
    broken = _changed(decoder, block_changes, **attention_changes)
    assert not compare_greedy(expected, _onnx_run(broken, case), case["mask"])["same_tokens"]


def test_what_the_descriptions_hold():
    smollm3 = describe_causal_lm(_tiny("smollm3"), MAX_LENGTH)
    assert [block.attention.no_rope for block in smollm3.blocks] == [True, False, False, False]
    gemma4 = describe_causal_lm(_tiny("gemma4"), MAX_LENGTH)
    layers = _tiny("gemma4").backbone.transformer_layers
    for block, layer in zip(gemma4.blocks, layers, strict=True):
        assert block.attention.scale == 1.0
        assert block.output_scale == float(keras.ops.convert_to_numpy(layer.layer_scalar))
        np.testing.assert_array_equal(block.attention.value_norm.scale, np.ones(32, np.float32))
    # K = V on the global layers: the value kernel is the key's.
    np.testing.assert_array_equal(gemma4.blocks[1].attention.value, gemma4.blocks[1].attention.key)
    assert not np.array_equal(gemma4.blocks[0].attention.value, gemma4.blocks[0].attention.key)


def test_proportional_tables_are_the_float64_angles():
    """Gemma 4's global layers: base 1e6, factor 4, the first 4 of the 16 pairs turned
    (rotary_dim 8 of head_dim 32), the rest cos 1 / sin 0, float64 rounded once."""
    decoder = describe_causal_lm(_tiny("gemma4"), MAX_LENGTH)
    local, global_ = decoder.blocks[0].attention.rope, decoder.blocks[1].attention.rope
    assert local is None and global_ is not None  # local: the decoder's tables
    inverse = 1e6 ** (-np.arange(0, 32, 2, dtype=np.float64) / 32) / 4.0
    inverse[4:] = 0.0
    angles = np.arange(MAX_LENGTH, dtype=np.float64)[:, None] * inverse
    np.testing.assert_array_equal(global_.cos, np.cos(angles).astype(np.float32))
    np.testing.assert_array_equal(global_.sin, np.sin(angles).astype(np.float32))
    local_angles = np.arange(MAX_LENGTH)[:, None] * 1e4 ** (-np.arange(0, 32, 2) / 32)
    np.testing.assert_array_equal(decoder.rope.cos, np.cos(local_angles).astype(np.float32))


def test_reference_is_gemma4_generate():
    """Gemma 4's generate step (a cache update mask) differs from the other families';
    the reference's tokens are still those of its compiled `generate()`."""
    assert_greedy_is_generate(tiny_causal_lm_2026("gemma4"))


def test_a_final_cap_of_the_causal_lm_is_exported_and_two_are_refused():
    causal_lm = tiny_causal_lm_2026("gemma4", final_logit_soft_cap=None)
    causal_lm = type(causal_lm)(backbone=causal_lm.backbone, preprocessor=None, final_logit_cap=2.0)
    decoder = describe_causal_lm(causal_lm, MAX_LENGTH)
    assert decoder.final_softcap == 2.0
    case = {**decoder_cases(VOCABULARY, MAX_LENGTH)[1], "steps": 8}
    expected = keras_hub_greedy(causal_lm)(case["prompts"], case["mask"], case["steps"])
    assert compare_greedy(expected, _onnx_run(decoder, case), case["mask"])["passed"]
    twice = type(causal_lm)(
        backbone=_tiny("gemma4").backbone, preprocessor=None, final_logit_cap=2.0
    )
    with pytest.raises(ExportError, match="soft-capped twice"):
        describe_causal_lm(twice, MAX_LENGTH)


@pytest.mark.parametrize(
    "family, options, message",
    [
        ("smollm3", {"partial_rotary_factor": 0.5}, "partial_rotary_factor=0.5 is not exported"),
        ("smollm3", {"layer_types": ["sliding_attention"] * 4}, "'sliding_attention' is not"),
        ("smollm3", {"mlp_bias": True}, r"has a bias \(mlp_bias=True\)"),
        ("smollm3", {"rope_layer_enabled_list": [False] * 4}, "no layer uses RoPE"),
        ("gemma4", {"use_bidirectional_attention": True}, "with use_bidirectional_attention"),
        (
            "gemma4",
            {
                "enable_moe_block": True,
                "num_experts": 2,
                "expert_intermediate_dim": 16,
                "num_experts_per_token": 1,
            },
            "Gemma4CausalLM with enable_moe_block is not exported",
        ),
    ],
)
def test_refusals(family, options, message):
    with pytest.raises(ExportError, match=message):
        describe_causal_lm(tiny_causal_lm_2026(family, **options), MAX_LENGTH)


def test_the_families_are_registered():
    assert {"SmolLM3CausalLM", "Gemma4CausalLM"} <= set(FAMILIES)


def test_rebuild_smollm3_with_its_nope_layer():
    """Without attention biases SmolLM3 rebuilds: the NoPE layer a `DecoderBlock` with
    `rope_dim=0`; the step model generates keras_hub's tokens, and so does its export
    (`describe_decoder` writes the block with `no_rope`)."""
    causal_lm = tiny_causal_lm_2026("smollm3", attention_bias=False)
    _, step = rebuild(causal_lm, MAX_LENGTH)
    blocks = [layer for layer in step.layers if isinstance(layer, DecoderBlock)]
    assert [block.attention.rotary_embedding is None for block in blocks] == [1, 0, 0, 0]
    case = {**decoder_cases(VOCABULARY, MAX_LENGTH)[1], "steps": 24}
    prompts, mask, steps = case["prompts"], case["mask"], case["steps"]
    expected = keras_hub_greedy(causal_lm)(prompts, mask, steps)
    result = compare_greedy(expected, keras_greedy(step, prompts, mask, steps), mask)
    assert result["passed"], result
    exported = describe_decoder(step, MAX_LENGTH)
    assert [block.attention.no_rope for block in exported.blocks] == [True, False, False, False]
    assert compare_greedy(expected, _onnx_run(exported, case), mask)["passed"]


def test_rebuild_refuses_what_decoder_blocks_lack():
    with pytest.raises(ExportError, match="has q/k/v biases, which keras_posenc's DecoderBlock"):
        rebuild(_tiny("smollm3"), MAX_LENGTH)
    with pytest.raises(ExportError, match="has per-head q/k norms, per-head v norms, sliding"):
        rebuild(_tiny("gemma4"), MAX_LENGTH)
