"""`save_decoder`'s verification reaches every position of the cache, not only the first 72.

The greedy cases end at position 71 (a prompt of 8, 64 steps). A defect that shows only
past it (a table row, a Llama 4 attention chunk, a window, a scaling switch) was kept.
The teacher-forced case runs a random prompt of `max_length` tokens in one call and
compares the logits at every position 0..max_length-1 with the reference's, in every
file written. Here: a tiny decoder of 128 slots whose file has one cos row past 71
changed by 1% (ONNX and LiteRT), and a step model with an attention chunk of 80 that the
file lacks (the file made from its chunk-free twin, so a refusal of the chunk elsewhere
does not hide what verification sees): each must fail, naming the case and the position.
"""

from __future__ import annotations

import dataclasses

import keras
import numpy as np
import onnxruntime
import pytest
from onnx import numpy_helper

from keras_posenc import DecoderBlock, decoder_models
from keras_posenc.export import VerificationError, save_decoder
from keras_posenc.export.decoder import check, decoder_onnx, describe_decoder, onnx_greedy, save

VOCABULARY, WIDTH, MAX_LENGTH = 40, 32, 128
ROW = 100  # past the greedy cases' last position (71)


def step_model(chunk: int | None = None, seed: int = 0):
    keras.utils.set_random_seed(seed)
    blocks = [DecoderBlock(16, 4, 2, 48, name=f"b{i}") for i in range(2)]
    for block in blocks:
        block.attention.attention_chunk_size = chunk  # Llama 4's chunked attention
    embedding = keras.layers.Embedding(VOCABULARY, WIDTH, embeddings_initializer="normal")
    head = keras.layers.Dense(VOCABULARY, use_bias=False)
    return decoder_models(
        embedding, blocks, keras.layers.RMSNormalization(), head, max_length=MAX_LENGTH
    )[1]


def _tampered_onnx(real):
    def emit(decoder, attention):
        model = real(decoder, attention)
        for tensor in model.graph.initializer:
            if tensor.name == "cos_cache":
                table = numpy_helper.to_array(tensor).copy()
                table[ROW] *= 1.01
                tensor.CopyFrom(numpy_helper.from_array(table, "cos_cache"))
        return model

    return emit


def _tampered_rope(decoder):
    cos = decoder.rope.cos.copy()
    cos[ROW] *= 1.01
    return dataclasses.replace(decoder, rope=dataclasses.replace(decoder.rope, cos=cos))


def _full_case(report) -> dict:
    (case,) = [c for c in report["cases"] if c["name"].startswith("teacher-forced")]
    return case


def test_a_table_row_past_71_fails_onnx(tmp_path, monkeypatch):
    monkeypatch.setattr(save, "decoder_onnx", _tampered_onnx(save.decoder_onnx))
    with pytest.raises(VerificationError, match="teacher-forced") as error:
        save_decoder(step_model(), tmp_path / "out", max_length=MAX_LENGTH)
    case = _full_case(error.value.report)
    result = case["runtimes"]["onnxruntime"]
    # The greedy cases pass: only the positions past 71 see the row.
    assert all(c["runtimes"]["onnxruntime"]["passed"] for c in error.value.report["cases"][:2])
    assert result["worst_position"] >= ROW and not result["passed"]
    assert f"position {result['worst_position']}" in str(error.value)
    assert not (tmp_path / "out").exists()


def test_a_table_row_past_71_fails_litert(tmp_path, monkeypatch):
    real = save.decoder_litert
    monkeypatch.setattr(save, "decoder_litert", lambda decoder: real(_tampered_rope(decoder)))
    with pytest.raises(VerificationError, match="litert, teacher-forced"):
        save_decoder(step_model(), tmp_path / "out", max_length=MAX_LENGTH, formats=("litert",))


def test_a_chunk_the_file_lacks_fails():
    chunked, plain = step_model(chunk=80), step_model(chunk=None)
    plain.set_weights(chunked.get_weights())
    session = onnxruntime.InferenceSession(
        decoder_onnx(describe_decoder(plain, MAX_LENGTH)).SerializeToString(),
        providers=["CPUExecutionProvider"],
    )
    runtimes = {"onnxruntime": lambda p, m, s: onnx_greedy(session, p, m, s, MAX_LENGTH)}
    report = check.verify_decoder(chunked, runtimes, MAX_LENGTH, VOCABULARY)
    assert not report["passed"]
    names = [c["name"] for c in report["cases"] if not c["runtimes"]["onnxruntime"]["passed"]]
    assert names == [_full_case(report)["name"]]  # the greedy cases end before the chunk
    assert _full_case(report)["runtimes"]["onnxruntime"]["worst_position"] >= 80
    # The same file passes against the chunk-free model: the chunk is what fails it.
    assert check.verify_decoder(plain, runtimes, MAX_LENGTH, VOCABULARY)["passed"]


def test_the_right_file_covers_every_position(tmp_path):
    report = save_decoder(
        step_model(), tmp_path / "out", max_length=MAX_LENGTH, formats=("onnx", "litert")
    )
    case = _full_case(report)
    assert case["positions"] == [0, MAX_LENGTH - 1] and case["batch"] == 1
    for runtime in ("onnxruntime", "litert"):
        result = case["runtimes"][runtime]
        assert result["passed"] and result["max_abs_error"] < check.ATOL, runtime
        assert 0 <= result["worst_position"] < MAX_LENGTH


def test_the_full_case_is_one_prompt_of_max_length():
    full = check.teacher_forced_case(VOCABULARY, MAX_LENGTH)
    assert full["prompts"].shape == (1, MAX_LENGTH) and full["steps"] == 0
    assert full["mask"].all() and np.isin(full["prompts"], np.arange(1, VOCABULARY)).all()
