"""`save_decoder`: the genai folder, its verification against Keras, and a float64 decode.

The onnxruntime file must pick the tokens of a float64 numpy decoder written from the
definitions (`decoder_reference.py`), with logits within optimum's float32 tolerance
(1e-5 + 1e-4·|x|, the bound the issue sets), where a wrong position or table is off by
1e-3 and more (checked: the reference with positions counting the padding is that far).
"""

from __future__ import annotations

import json

import keras
import numpy as np
import onnxruntime
import pytest
from decoder_reference import reference_greedy

from keras_posenc import DecoderBlock, decoder_models
from keras_posenc.export import VerificationError, save_decoder
from keras_posenc.export.decoder import check, decoder_cases, onnx_greedy, save
from keras_posenc.export.errors import ExportError

VOCABULARY, WIDTH, MAX_LENGTH = 40, 64, 80


def step_model(mlp="swiglu", rope_dim=None, rope_layout="half", layers=2, head_dim=16):
    blocks = [
        DecoderBlock(
            head_dim, 4, 2, 96, mlp=mlp, rope_dim=rope_dim, rope_layout=rope_layout, name=f"b{i}"
        )
        for i in range(layers)
    ]
    embedding = keras.layers.Embedding(VOCABULARY, WIDTH, embeddings_initializer="normal")
    head = keras.layers.Dense(VOCABULARY, use_bias=False)
    return decoder_models(
        embedding, blocks, keras.layers.RMSNormalization(), head, max_length=MAX_LENGTH
    )[1]


def _session(folder):
    return onnxruntime.InferenceSession(
        str(folder / "model.onnx"), providers=["CPUExecutionProvider"]
    )


@pytest.mark.parametrize(
    "options",
    [{}, {"mlp": "gelu", "rope_layout": "interleaved"}, {"rope_dim": 16, "head_dim": 32}],
    ids=["swiglu-half", "gelu-interleaved", "partial-rotary"],
)
def test_onnx_matches_a_float64_decode(tmp_path, options):
    model = step_model(**options)
    save_decoder(model, tmp_path / "out", max_length=MAX_LENGTH, verify=False)
    session = _session(tmp_path / "out")
    case = decoder_cases(VOCABULARY, MAX_LENGTH)[1]  # batch 4, left-padded
    prompts, mask, steps = case["prompts"], case["mask"], 12
    tokens, logits = onnx_greedy(session, prompts, mask, steps, MAX_LENGTH)
    expected = reference_greedy(model, prompts, mask, steps)
    result = check.compare_greedy(expected, (tokens, logits), mask)
    assert result["passed"], result


def test_reference_tells_wrong_positions_apart(tmp_path, monkeypatch):
    """The comparison above can fail: padding counted as positions is off by far more."""
    model = step_model()
    save_decoder(model, tmp_path / "out", max_length=MAX_LENGTH, verify=False)
    case = decoder_cases(VOCABULARY, MAX_LENGTH)[1]
    prompts, mask = case["prompts"], case["mask"]
    tokens, logits = onnx_greedy(_session(tmp_path / "out"), prompts, mask, 4, MAX_LENGTH)
    wrong = reference_greedy(model, prompts, np.ones_like(mask), 4)  # the padding as tokens
    row = 3  # 3 padding tokens
    assert np.abs(wrong[1][1][row] - logits[1][row]).max() > 1e-3


def test_save_decoder_writes_a_verified_genai_folder(tmp_path):
    model = step_model()
    formats = ("onnx", "litert")
    report = save_decoder(model, tmp_path / "out", max_length=MAX_LENGTH, formats=formats)
    files = {path.name for path in (tmp_path / "out").iterdir()}
    assert {"model.onnx", "genai_config.json", "model.tflite", "verification.json"} <= files
    # The greedy cases, then the teacher-forced one over every position (batch 1).
    assert report["passed"] and [c["batch"] for c in report["cases"]] == [1, 4, 1]
    assert report["formats"] == ["onnx", "litert"]
    assert [case["steps"] for case in report["cases"]] == [64, 64, 0]
    for case in report["cases"]:
        for runtime in ("onnxruntime", "litert"):
            result = case["runtimes"][runtime]
            assert result["same_tokens"] and result["max_abs_error"] < check.ATOL, runtime
    config = json.loads((tmp_path / "out" / "genai_config.json").read_text())
    decoder = config["model"]["decoder"]
    assert (decoder["num_hidden_layers"], decoder["num_key_value_heads"]) == (2, 2)
    assert config["search"]["past_present_share_buffer"] is True
    assert config["model"]["context_length"] == MAX_LENGTH
    session = _session(tmp_path / "out")
    names = [value.name for value in session.get_inputs()]
    assert names == ["input_ids", "attention_mask"] + [
        f"past_key_values.{i}.{kind}" for i in range(2) for kind in ("key", "value")
    ]
    assert session.get_inputs()[2].shape[1:] == [2, "past_sequence_length", 16]


def test_a_wrong_file_fails_with_the_step_and_row_and_leaves_a_report(tmp_path, monkeypatch):
    model = step_model()
    real = save.decoder_onnx

    def perturbed(decoder, attention):
        onnx_model = real(decoder, attention)
        for tensor in onnx_model.graph.initializer:
            if tensor.name == "cos_cache":  # one row off, far from the prompt
                from onnx import numpy_helper

                table = numpy_helper.to_array(tensor).copy()
                table[40] *= 1.01
                tensor.CopyFrom(numpy_helper.from_array(table, "cos_cache"))
        return onnx_model

    monkeypatch.setattr(save, "decoder_onnx", perturbed)
    with pytest.raises(VerificationError, match=r"step \d+, row \d") as error:
        save_decoder(model, tmp_path / "out", max_length=MAX_LENGTH)
    assert not (tmp_path / "out").exists()
    report = json.loads(save.failed_report_path(tmp_path / "out").read_text())
    assert report == json.loads(json.dumps(error.value.report)) and not report["passed"]
    # Position 40 is reached at step 33 (prompt of 8 at 0..7; row 0 has no padding).
    worst = report["cases"][0]["runtimes"]["onnxruntime"]
    assert worst["worst_step"] >= 33 or worst.get("first_different_token", {}).get("step", 0) >= 33


def test_refuses_other_layers_by_name(tmp_path):
    ids = keras.Input((None,), dtype="int32", name="token_ids")
    x = keras.layers.Embedding(VOCABULARY, WIDTH)(ids)
    x = keras.layers.LayerNormalization(name="not_rms")(x)
    model = keras.Model(ids, keras.layers.Dense(VOCABULARY)(x))
    with pytest.raises(ExportError, match="'not_rms' is a LayerNormalization"):
        save_decoder(model, tmp_path / "out", max_length=MAX_LENGTH)


def test_refuses_head_dims_gqa_cannot_rotate(tmp_path):
    with pytest.raises(ExportError, match="multiple of 16.*attention='standard'"):
        save_decoder(step_model(head_dim=8), tmp_path / "out", max_length=MAX_LENGTH)


def test_refuses_rotary_widths_gqa_cannot_rotate(tmp_path):
    """onnxruntime's kernel refuses cos/sin caches of 4 columns (checked by hand)."""
    with pytest.raises(ExportError, match="rotary_dim / 2 to be a multiple of 8.*rotary_dim=8"):
        save_decoder(step_model(rope_dim=8), tmp_path / "out", max_length=MAX_LENGTH)
    assert not (tmp_path / "out").exists()


def _bfloat16_step_model():
    blocks = [DecoderBlock(16, 4, 2, 32, dtype="bfloat16", name=f"b{i}") for i in range(2)]
    return decoder_models(
        keras.layers.Embedding(VOCABULARY, WIDTH, dtype="bfloat16"),
        blocks,
        keras.layers.RMSNormalization(dtype="bfloat16"),
        keras.layers.Dense(VOCABULARY, dtype="bfloat16"),
        max_length=MAX_LENGTH,
    )[1]


def test_a_bfloat16_model_is_exported_and_verified_as_its_float32_copy(tmp_path):
    """The files are float32: verified against Keras in bfloat16 they would fail by 1e-2."""
    model = _bfloat16_step_model()
    with pytest.warns(UserWarning, match="float32 copy"):
        report = save_decoder(model, tmp_path / "out", max_length=MAX_LENGTH, formats="onnx")
    assert report["passed"]
    with pytest.raises(ExportError, match="bfloat16"):
        save_decoder(model, tmp_path / "other", max_length=MAX_LENGTH, bfloat16="error")


def test_a_logits_tolerance_is_relative_to_its_rows_scale_not_to_itself():
    # A logit's float32 error comes from its row's hidden state and the head, so a logit
    # near 0 carries the error of its row's large ones: 4e-5 on a logit of 1e-3 in a row
    # of RMS 2 is float32 noise, and 1e-3 is not.
    mask = np.ones((1, 2), np.int64)
    row = np.array([3.0, -2.0, 1e-3, 2.0], np.float32)
    expected_logits = [np.stack([row, row])[None], row[None]]
    expected = (np.zeros((1, 2), np.int32), expected_logits)

    def shifted(by: float):
        got = [logits.copy() for logits in expected_logits]
        got[1][0, 2] += by
        return np.zeros((1, 2), np.int32), got

    assert check.compare_greedy(expected, shifted(4e-5), mask)["passed"]
    assert not check.compare_greedy(expected, shifted(1e-3), mask)["passed"]
