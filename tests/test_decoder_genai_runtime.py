"""`save_decoder` runs the staged folder as onnxruntime-genai will, and writes end tokens
it can load: ids outside the vocabulary refused by name before any work, and without an
end token a warning (og 0.18 needs one inside the vocabulary and stops there)."""

from __future__ import annotations

import json

import keras
import numpy as np
import pytest

from keras_posenc import DecoderBlock, decoder_models
from keras_posenc.export import ExportError, save_decoder
from keras_posenc.export.decoder import check, genai_config, keras_greedy, save

og = pytest.importorskip("onnxruntime_genai")

VOCABULARY, WIDTH = 40, 32


def step_model(max_length: int):
    keras.utils.set_random_seed(0)
    blocks = [DecoderBlock(16, 4, 2, 48, name=f"b{i}") for i in range(2)]
    embedding = keras.layers.Embedding(VOCABULARY, WIDTH, embeddings_initializer="normal")
    head = keras.layers.Dense(VOCABULARY, use_bias=False, kernel_initializer="normal")
    norm = keras.layers.RMSNormalization()
    return decoder_models(embedding, blocks, norm, head, max_length=max_length)[1]


@pytest.fixture(scope="module")
def model():
    return step_model(16)


def test_verification_runs_the_folder_in_og(tmp_path, model):
    """max_length 16: the prompt of 8 and 8 steps fill the cache, so og's full sequence is
    reached (its last token fed as part of a prompt)."""
    report = save_decoder(model, tmp_path / "out", max_length=16, eos_token_id=39)
    for case in report["cases"]:
        assert case["runtimes"]["onnxruntime-genai"]["passed"], case
    assert report["cases"][0]["steps"] + 8 == 16  # the greedy case of batch 1


def test_og_runner_goes_on_past_its_end_token(tmp_path, model):
    """An end token the model picks (og stops there and drops it): the runner appends it
    and goes on, so every step is compared with Keras's tokens."""
    prompts, mask = check.decoder_cases(VOCABULARY, 16)[0]["prompts"], None
    mask = np.ones_like(prompts)
    tokens, _ = keras_greedy(model, prompts, mask, 7)
    eos = int(tokens[0, 2])
    report = save_decoder(model, tmp_path / "out", max_length=16, eos_token_id=eos)
    assert report["cases"][0]["runtimes"]["onnxruntime-genai"]["same_tokens"]
    model_og = og.Model(str(tmp_path / "out"))
    params = og.GeneratorParams(model_og)
    params.set_search_options(do_sample=False, max_length=16)
    generator = og.Generator(model_og, params)
    generator.append_tokens(prompts.astype(np.int32))
    while not generator.is_done():
        generator.generate_next_token()
    assert len(generator.get_sequence(0)) < 16  # og itself stopped at the end token


def test_a_folder_og_refuses_is_not_kept(tmp_path, model, monkeypatch):
    """Were an id outside the vocabulary written (as before the entry checked it), og's
    refusal at load ends the save and nothing is kept."""

    def out_of_range(decoder, **ids):
        return {
            **genai_config(decoder, **ids),
            "model": {**genai_config(decoder, **ids)["model"], "eos_token_id": VOCABULARY},
        }

    monkeypatch.setattr(save, "genai_config", out_of_range)
    refused = r"onnxruntime-genai cannot run the exported folder \(eos_token_id \(40\)"
    with pytest.raises(ExportError, match=refused):
        save_decoder(model, tmp_path / "out", max_length=16)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "ids, name",
    [
        ({"eos_token_id": VOCABULARY}, "eos_token_id 40"),
        ({"eos_token_id": [3, -1]}, "eos_token_id -1"),
        ({"pad_token_id": 1000}, "pad_token_id 1000"),
        ({"bos_token_id": -2}, "bos_token_id -2"),
    ],
)
def test_ids_outside_the_vocabulary_are_refused_before_any_work(
    tmp_path, model, ids, name, monkeypatch
):
    def no_work(*args, **kwargs):
        raise AssertionError("an ONNX graph was written before the ids were checked")

    monkeypatch.setattr(save, "decoder_onnx", no_work)
    with pytest.raises(ExportError, match=rf"{name} is outside the model's vocabulary \[0, 40\)"):
        save_decoder(model, tmp_path / "out", max_length=16, **ids)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "ids",
    [{"eos_token_id": "2"}, {"eos_token_id": []}, {"pad_token_id": 1.0}, {"bos_token_id": True}],
)
def test_ids_of_another_type_are_refused_by_name(tmp_path, model, ids):
    name = next(iter(ids))
    with pytest.raises(TypeError, match=name):
        save_decoder(model, tmp_path / "out", max_length=16, **ids)


def test_no_end_token_warns_and_writes_the_pad_id(tmp_path, model):
    with pytest.warns(UserWarning, match="og.Generator stops wherever the model picks it"):
        save_decoder(model, tmp_path / "out", max_length=16, pad_token_id=5, verify=False)
    config = json.loads((tmp_path / "out" / "genai_config.json").read_text())["model"]
    assert (config["eos_token_id"], config["pad_token_id"], config["bos_token_id"]) == (5, 5, 0)
    og.Model(str(tmp_path / "out"))  # loads
