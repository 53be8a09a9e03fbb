"""Quantized `.litertlm` bundles: a `decoder_models` step model with its tokenizer in int8
and int4, and the bundle's own `.tflite` verified teacher-forced at every position.

The engine's text is judged against Keras's greedy text of the dequantized model (a
differing text passes only at a near tie of the reference), and the `.tflite` the bundle
packs (its bytes read back from the bundle) against the dequantized reference as the
quantized `formats=("litert",)` file is: within the int8-activation bound, and with float
arithmetic within float32 tolerance, at every position `0..max_length-1`. A bundle whose
weight is wrong fails there, whatever its text.
"""

from __future__ import annotations

import numpy as np
import pytest
from test_decoder_litertlm_step import MAX_LENGTH, tiny_step_model
from tiny_sentencepiece import LLAMA, sentencepiece_proto

from keras_posenc.export import VerificationError, save_decoder
from keras_posenc.export.decoder import litert_quantize
from keras_posenc.export.decoder.litertlm_quantized import BUNDLE_TFLITE
from keras_posenc.export.decoder.quantized_save import LITERT_FLOAT_RUNTIME

pytest.importorskip("litert_lm")
pytest.importorskip("litert_lm_builder")
import keras_hub  # noqa: E402  (after the skips: the bundle needs LiteRT-LM)


@pytest.fixture(scope="module")
def tokenizer():
    return keras_hub.tokenizers.SentencePieceTokenizer(proto=sentencepiece_proto(LLAMA))


@pytest.fixture(scope="module")
def step(tokenizer):
    return tiny_step_model(tokenizer.vocabulary_size())


def _save(step, tokenizer, folder, mode, template=None, max_length=MAX_LENGTH):
    return save_decoder(
        step,
        folder,
        max_length=max_length,
        formats=("litertlm",),
        tokenizer=tokenizer,
        quantize=mode,
        prompt_template=template,
        verbose=0,
    )


# int4 with a prompt template: the texts' judge prefills the ids the engine prefills.
@pytest.mark.parametrize(
    "mode,template", [("int8", None), ("int4", {"user": {"prefix": "the ", "suffix": " dog"}})]
)
def test_a_quantized_step_model_bundle_is_verified(step, tokenizer, tmp_path, mode, template):
    before = [w.copy() for w in step.get_weights()]
    report = _save(step, tokenizer, tmp_path / "b", mode, template)["litertlm"]
    assert report["passed"] and report["quantization"]["bits"] == {"int8": 8, "int4": 4}[mode]
    assert any(case["keras_hub"] for case in report["cases"])  # not only empty texts
    for case in report["cases"]:
        assert case["equal"] or case["reference_margin"] <= 2 * case["bound"], case
    tflite = report["tflite"]
    assert tflite["passed"]
    forced = tflite["cases"][-1]
    assert forced["name"].startswith("teacher-forced") and forced["steps"] == 0
    assert forced["last_position"] == MAX_LENGTH - 1  # every position the engine reaches
    for case in tflite["cases"]:
        assert set(case["runtimes"]) == {BUNDLE_TFLITE, LITERT_FLOAT_RUNTIME}, case
    for was, now in zip(before, step.get_weights(), strict=True):
        np.testing.assert_array_equal(was, now)  # the dequantized reference is undone


def test_a_wrong_bundle_weight_fails_the_tflite_check(step, tokenizer, tmp_path, monkeypatch):
    """The first stored weight's scales 2% off in the bundle alone (the reference keeps
    `quantize.py`'s): the texts may still pass and the int8-activation bound hold (both
    did here, docs/litertlm.md), the float-arithmetic twin of the .tflite does not."""
    import dataclasses

    quantize, wrong = litert_quantize.quantize, []

    def first_weight_off(kernel, bits, block_size, rule):
        stored = quantize(kernel, bits, block_size, rule=rule)
        if not wrong:
            wrong.append(stored)
            stored = dataclasses.replace(stored, scales=stored.scales * 1.02)
        return stored

    monkeypatch.setattr(litert_quantize, "quantize", first_weight_off)
    with pytest.raises(VerificationError, match=r"^The bundle's \.tflite: ") as failed:
        _save(step, tokenizer, tmp_path / "w", "int8", max_length=20)  # cheaper: one prefill
    assert wrong and not (tmp_path / "w").exists()
    cases = failed.value.report["litertlm"]["tflite"]["cases"]
    assert cases[-1]["name"].startswith("teacher-forced")
    for case in cases:  # the float twin, to float32 tolerance, fails on every case
        assert not case["runtimes"][LITERT_FLOAT_RUNTIME]["passed"], case
