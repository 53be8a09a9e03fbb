"""keras_hub CausalLMs through `save_decoder`, verified against keras_hub itself.

Each family's tiny random model (`keras_hub_models.py`) is exported and must generate
keras_hub's greedy tokens over 64 steps, batch 1 and a left-padded batch 4, with logits
within 1e-5 + 1e-4·|x| (what `save_decoder` checks before it keeps the folder); the
LiteRT file too for the families that between them have every optional part (Qwen2's
biases; Gemma 2's soft caps, windows, post norms, GeGLU and embedding scale; Gemma 3's
q/k norms and per-layer tables), its converter taking seconds a model; and the
standard-op graph (`attention="standard"`) for the same families. The
reference, keras_hub's `call_with_cache` driven as `generate()` drives it, is checked
against `generate()` itself; the settings each family adds (the sliding window, the
biases, the q/k norms, soft caps, Gemma 3's global RoPE, llama3 scaling) are checked to
matter: dropped, the tokens change.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import subprocess
import sys

import numpy as np
import onnxruntime
import pytest
from keras_hub_models import (
    FAMILIES,
    GENAI,
    MAX_LENGTH,
    VOCABULARY,
    assert_greedy_is_generate,
    tiny_causal_lm,
)

from keras_posenc.export import save_decoder
from keras_posenc.export.decoder import (
    check,
    compare_greedy,
    decoder_cases,
    decoder_onnx,
    onnx_greedy,
    runtime_version,
)
from keras_posenc.export.decoder.greedy_generation import keras_greedy
from keras_posenc.export.errors import ExportError
from keras_posenc.keras_hub import describe_causal_lm, keras_hub_greedy, rebuild

# The families with parts onnxruntime computes as the export means them only from 1.32 on
# (windows and soft caps in GroupQueryAttention; soft caps in ONNX's Attention): with 1.23,
# the oldest supported, their files failed verification, so the export refuses them there.
NEEDS_ONNXRUNTIME_1_32 = {"gqa": {"mistral", "gemma2", "gemma3"}, "standard": {"gemma2"}}
OLDER_ONNXRUNTIME = runtime_version._installed() < (1, 32)


def _refused_here(family: str, attention: str = "gqa") -> bool:
    return OLDER_ONNXRUNTIME and family in NEEDS_ONNXRUNTIME_1_32[attention]


@functools.cache
def _tiny(family: str):
    """One model per family for the tests that only read it."""
    return tiny_causal_lm(family)


# The families with a sliding window below MAX_LENGTH (the verification's long case).
WINDOWED = ("mistral", "gemma2", "gemma3")
# The families whose LiteRT file is verified too (every optional part between them).
LITERT_FAMILIES = ("qwen2", "gemma2", "gemma3")


@pytest.mark.parametrize("family", list(FAMILIES))
def test_export_generates_as_keras_hub(tmp_path, family):
    causal_lm = _tiny(family)
    litert = family in LITERT_FAMILIES
    formats = ("onnx", "litert") if litert else ("onnx",)
    if _refused_here(family):
        with pytest.raises(ExportError, match="computes otherwise than the export means"):
            save_decoder(causal_lm, tmp_path / "out", max_length=MAX_LENGTH, formats=formats)
        assert not (tmp_path / "out").exists()
        return
    report = save_decoder(causal_lm, tmp_path / "out", max_length=MAX_LENGTH, formats=formats)
    assert report["passed"]
    # The windowed families' third case goes past the window to the cache's end.
    long = [check.LONG_STEPS] if family in WINDOWED else []
    # Then the teacher-forced case over every position (no steps).
    assert [case["steps"] for case in report["cases"]] == [64, 64, *long, 0]
    assert report["cases"][-2]["last_position"] == (MAX_LENGTH - 1 if long else 71)
    assert report["cases"][-1]["positions"] == [0, MAX_LENGTH - 1]
    runtimes = ["onnxruntime", "litert"] if litert else ["onnxruntime"]
    runtimes += GENAI  # og.Model on the folder, where onnxruntime-genai is installed
    for case in report["cases"]:
        assert sorted(case["runtimes"]) == sorted(runtimes)
        for result in case["runtimes"].values():
            assert result["same_tokens"] and result["within_tolerance"], (case["name"], result)
    assert (tmp_path / "out" / "model.tflite").exists() == litert
    config = json.loads((tmp_path / "out" / "genai_config.json").read_text())
    assert config["model"]["vocab_size"] == VOCABULARY
    assert config["model"]["context_length"] == MAX_LENGTH


@pytest.mark.parametrize("family", LITERT_FAMILIES)
def test_standard_graph_generates_as_keras_hub(tmp_path, family):
    if _refused_here(family, "standard"):
        with pytest.raises(ExportError, match="computes otherwise than the export means"):
            save_decoder(
                _tiny(family), tmp_path / "out", max_length=MAX_LENGTH, attention="standard"
            )
        return
    report = save_decoder(
        _tiny(family), tmp_path / "out", max_length=MAX_LENGTH, attention="standard"
    )
    assert report["passed"] and report["attention"] == "standard"
    for case in report["cases"]:
        result = case["runtimes"]["onnxruntime"]
        assert result["same_tokens"] and result["within_tolerance"], (case["name"], result)


def _onnx_run(decoder, case):
    model = decoder_onnx(decoder)
    session = onnxruntime.InferenceSession(
        model.SerializeToString(), providers=["CPUExecutionProvider"]
    )
    return onnx_greedy(session, case["prompts"], case["mask"], case["steps"], MAX_LENGTH)


def _without(decoder, **changes):
    """`decoder` with every attention's fields replaced by `changes`."""
    blocks = tuple(
        dataclasses.replace(block, attention=dataclasses.replace(block.attention, **changes))
        for block in decoder.blocks
    )
    return dataclasses.replace(decoder, blocks=blocks)


@pytest.mark.parametrize(
    "family, dropped",
    [
        ("mistral", {"window": None}),
        ("qwen2", {"query_bias": None, "key_bias": None, "value_bias": None}),
        ("qwen3", {"query_norm": None, "key_norm": None}),
        ("gemma2", {"softcap": 0.0}),
        ("gemma2", {"window": None}),
        ("gemma3", {"rope": None}),  # the global layer's tables: the local layers' instead
        ("gemma3", {"query_norm": None, "key_norm": None}),
    ],
)
def test_each_setting_matters(family, dropped):
    """Dropped from the export, the family's own setting changes the tokens: the
    verification above would catch it being read or written wrongly."""
    if _refused_here(family):
        with pytest.raises(ExportError, match="computes otherwise than the export means"):
            decoder_onnx(describe_causal_lm(_tiny(family), MAX_LENGTH))
        return
    causal_lm = _tiny(family)
    # 24 steps: positions to 31, past the windows of 16.
    case = {**decoder_cases(VOCABULARY, MAX_LENGTH)[1], "steps": 24}
    expected = keras_hub_greedy(causal_lm)(case["prompts"], case["mask"], case["steps"])
    decoder = describe_causal_lm(causal_lm, MAX_LENGTH)
    assert compare_greedy(expected, _onnx_run(decoder, case), case["mask"])["passed"]
    broken = compare_greedy(expected, _onnx_run(_without(decoder, **dropped), case), case["mask"])
    assert not broken["same_tokens"]


def test_llama3_scaling_matters():
    causal_lm = _tiny("llama3")
    plain = tiny_causal_lm(
        "llama3",
        rope_frequency_adjustment_factor=None,
        rope_low_freq_factor=None,
        rope_high_freq_factor=None,
        rope_pretraining_sequence_length=None,
    )
    scaled = describe_causal_lm(causal_lm, MAX_LENGTH).rope
    unscaled = describe_causal_lm(plain, MAX_LENGTH).rope
    assert np.abs(scaled.cos - unscaled.cos).max() > 0.1


def test_reference_is_keras_hub_generate():
    """The reference's tokens are those of keras_hub's own `generate` (greedy sampler,
    its compiled generate function), for prompts of different lengths in one batch (the
    reference is one driver for every family; Mistral's has a window to pass)."""
    assert_greedy_is_generate(tiny_causal_lm("mistral"))


def test_exact_tables_are_the_float64_angles_and_keras_hub_differs():
    """The export's tables are float64 angles rounded once (numpy here); keras_hub's
    float32 recomputation is off by more than that rounding, within float32's error."""
    causal_lm = _tiny("mistral")
    exact = describe_causal_lm(causal_lm, MAX_LENGTH).rope
    keras_hub = describe_causal_lm(causal_lm, MAX_LENGTH, tables="keras_hub").rope
    inverse = 10000.0 ** (-np.arange(0, 16, 2, dtype=np.float64) / 16)
    angles = np.arange(MAX_LENGTH, dtype=np.float64)[:, None] * inverse
    np.testing.assert_array_equal(exact.cos, np.cos(angles).astype(np.float32))
    np.testing.assert_array_equal(exact.sin, np.sin(angles).astype(np.float32))
    difference = np.abs(keras_hub.cos.astype(np.float64) - np.cos(angles)).max()
    assert 2.0**-24 < difference < MAX_LENGTH * 2.0**-20


def test_refusals(tmp_path):
    with pytest.raises(ExportError, match="rope_position_scaling_factor"):
        describe_causal_lm(tiny_causal_lm("llama", rope_position_scaling_factor=2.0), 64)
    # Past su's switch (128) a cached key keeps its short-factor rotation: no one table.
    with pytest.raises(ExportError, match="max_length <= 128"):
        describe_causal_lm(_tiny("phi3"), 129)
    with pytest.raises(ExportError, match="query_head_dim_normalize=False"):
        describe_causal_lm(tiny_causal_lm("gemma2", query_head_dim_normalize=False), 64)
    with pytest.raises(ExportError, match='dtype="float32"'):
        describe_causal_lm(tiny_causal_lm("llama", dtype="bfloat16"), 64)
    import keras_hub

    gpt2 = keras_hub.models.GPT2CausalLM(
        backbone=keras_hub.models.GPT2Backbone(
            vocabulary_size=50,
            num_layers=1,
            num_heads=2,
            hidden_dim=32,
            intermediate_dim=32,
            max_sequence_length=64,
        )
    )
    with pytest.raises(ExportError, match="GPT2CausalLM is not one of them"):
        save_decoder(gpt2, tmp_path / "gpt2", max_length=64)
    assert not (tmp_path / "gpt2").exists()


@pytest.mark.parametrize("family", ["llama3", "phi3"])
def test_rebuild_generates_as_keras_hub(family):
    """The package's own layers with keras_hub's weights (llama3 and su scaling: the
    RoPE settings are carried over, not only the weights)."""
    causal_lm = _tiny(family)
    _, step = rebuild(causal_lm, MAX_LENGTH)
    case = {**decoder_cases(VOCABULARY, MAX_LENGTH)[1], "steps": 24}
    prompts, mask, steps = case["prompts"], case["mask"], case["steps"]
    expected = keras_hub_greedy(causal_lm)(prompts, mask, steps)
    result = compare_greedy(expected, keras_greedy(step, prompts, mask, steps), mask)
    assert result["passed"], result


def test_rebuild_refuses_the_parts_decoder_blocks_lack():
    with pytest.raises(ExportError, match="has q/k/v biases, which keras_posenc's DecoderBlock"):
        rebuild(_tiny("qwen2"), MAX_LENGTH)
    with pytest.raises(ExportError, match="has GeGLU MLPs, an embedding scale, which"):
        rebuild(_tiny("gemma"), MAX_LENGTH)
    with pytest.raises(ExportError, match="has sliding windows"):
        rebuild(_tiny("mistral"), MAX_LENGTH)
    # A window as wide as the cache masks nothing: Mistral then rebuilds.
    rebuild(tiny_causal_lm("mistral", sliding_window=MAX_LENGTH), MAX_LENGTH)


def test_keras_hub_is_not_imported_by_the_package():
    # The bridge first: it imports the export package, which imports it back lazily.
    code = (
        "import sys, keras_posenc.keras_hub, keras_posenc, keras_posenc.export; "
        "assert 'keras_hub' not in sys.modules, 'keras_hub imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("installed, refused", [((1, 23), True), ((1, 31), True), ((1, 32), False)])
def test_windows_and_soft_caps_are_refused_below_onnxruntime_1_32(monkeypatch, installed, refused):
    # Whatever onnxruntime this runs with: the refusal follows the version it reports.
    monkeypatch.setattr(runtime_version, "_installed", lambda: installed)
    gemma2 = describe_causal_lm(_tiny("gemma2"), MAX_LENGTH)  # windows and soft caps
    llama = describe_causal_lm(_tiny("llama"), MAX_LENGTH)  # neither
    for attention in ("gqa", "standard"):
        runtime_version.refuse_older_onnxruntime(llama, attention)
        if refused:
            message = r"attention soft caps, which onnxruntime 1\.(23|31) computes otherwise"
            with pytest.raises(ExportError, match=message):
                runtime_version.refuse_older_onnxruntime(gemma2, attention)
        else:
            runtime_version.refuse_older_onnxruntime(gemma2, attention)
