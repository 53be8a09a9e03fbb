"""`save_decoder` of `DecoderBlock`s whose attention has q/k norms (Qwen3's, Gemma 3's).

The per-head norms before RoPE go into the description's `query_norm` / `key_norm` (the
parts keras_hub's Qwen3 and Gemma 3 use), so every emitter writes them one way. The ONNX
file must pick the tokens of the float64 decoder of `decoder_reference.py` (which applies
the norms from their definition) within optimum's float32 tolerance, where the same
reference without the norms is off by far more; `save_decoder`'s own verification against
Keras passes; the other kinds are refused naming the kind.
"""

from __future__ import annotations

import keras
import numpy as np
import onnxruntime
import pytest
from decoder_reference import reference_greedy

from keras_posenc import DecoderBlock, decoder_models
from keras_posenc.export import save_decoder
from keras_posenc.export.decoder import check, decoder_cases, describe_decoder, onnx_greedy
from keras_posenc.export.decoder.description import optional_parts
from keras_posenc.export.errors import ExportError

VOCABULARY, WIDTH, MAX_LENGTH = 40, 64, 48


def _step_model(kind: str):
    blocks = [
        DecoderBlock(16, 4, 2, 96, query_key_norm=kind, query_key_norm_epsilon=1e-5, name=f"b{i}")
        for i in range(2)
    ]
    embedding = keras.layers.Embedding(VOCABULARY, WIDTH, embeddings_initializer="normal")
    head = keras.layers.Dense(VOCABULARY, use_bias=False)
    step = decoder_models(
        embedding, blocks, keras.layers.RMSNormalization(), head, max_length=MAX_LENGTH
    )[1]
    rng = np.random.default_rng(0)
    for block in blocks:  # scales away from their initial values: a scale misread shows
        for norm in (block.attention.query_norm, block.attention.key_norm):
            if norm.scale is None:  # l2_after_rope: no scale
                continue
            norm.scale.assign(
                rng.uniform(-0.5, 0.5, tuple(norm.scale.shape)) + (kind == "rms_per_head")
            )
    return step


@pytest.mark.parametrize("kind", ["rms_per_head", "gemma_rms_per_head"])
def test_onnx_with_query_key_norms_matches_a_float64_decode(tmp_path, kind, monkeypatch):
    model = _step_model(kind)
    decoder = describe_decoder(model, MAX_LENGTH)
    assert optional_parts(decoder) == ["per-head q/k norms"]
    attention = model.get_layer("b0").attention
    scale = np.asarray(attention.query_norm.scale)
    stored = decoder.blocks[0].attention.query_norm
    np.testing.assert_array_equal(stored.scale, scale + np.float32(kind == "gemma_rms_per_head"))
    assert stored.epsilon == 1e-5

    save_decoder(model, tmp_path / "out", max_length=MAX_LENGTH, formats="onnx", verify=False)
    session = onnxruntime.InferenceSession(
        str(tmp_path / "out" / "model.onnx"), providers=["CPUExecutionProvider"]
    )
    case = decoder_cases(VOCABULARY, MAX_LENGTH)[1]  # batch 4, left-padded
    prompts, mask, steps = case["prompts"], case["mask"], 8
    tokens, logits = onnx_greedy(session, prompts, mask, steps, MAX_LENGTH)
    expected = reference_greedy(model, prompts, mask, steps)
    result = check.compare_greedy(expected, (tokens, logits), mask)
    assert result["passed"], result

    # The comparison can fail: the reference without the norms is far off.
    for name in ("b0", "b1"):
        monkeypatch.setattr(model.get_layer(name).attention, "query_key_norm", None)
    without = reference_greedy(model, prompts, mask, 2)
    assert np.abs(without[1][0] - logits[0]).max() > 1e-2


def test_save_decoder_verifies_query_key_norms_against_keras(tmp_path):
    model = _step_model("gemma_rms_per_head")
    for attention in ("gqa", "standard"):
        folder = tmp_path / attention
        report = save_decoder(
            model, folder, max_length=MAX_LENGTH, attention=attention, formats="onnx"
        )
        assert report["passed"], report


@pytest.mark.parametrize("kind", ["rms_across_heads", "rms_per_head_after_rope", "l2_after_rope"])
def test_other_query_key_norms_are_refused_by_kind(tmp_path, kind):
    with pytest.raises(ExportError, match=f"'attention': query_key_norm='{kind}' is not exported"):
        save_decoder(_step_model(kind), tmp_path / "out", max_length=MAX_LENGTH)
    assert not (tmp_path / "out").exists()
