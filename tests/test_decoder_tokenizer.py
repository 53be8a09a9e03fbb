"""The folder carries the tokenizer: `og.Tokenizer(og.Model(folder))` encodes and decodes
as keras_hub's tokenizer does, and og.Generator writes keras_hub's `generate()` text.

The tokenizer is made here without downloads: a byte-level BPE trained in a few lines on a
few sentences (pre-split as GPT-2 splits, as real BPE vocabularies are trained), then a
keras_hub `Llama3Tokenizer` of that vocabulary and those merges.
"""

from __future__ import annotations

import json
import shutil
from types import SimpleNamespace

import keras_hub
import numpy as np
import pytest
from keras_hub_models import og_greedy_text, redraw
from tiny_byte_pair import CORPUS, train_byte_pair

from keras_posenc.export import save_decoder
from keras_posenc.export.decoder.tokenizer_files import tokenizer_files

og = pytest.importorskip("onnxruntime_genai")

TEXTS = [
    "the cat sat on the mat.",
    "the dog ran too!",
    "hello world\n\nthe end",
    "a bird sang 12 songs in 2024; ok",
    "ünïcode, émoji 🙂 too",
    "the cat<|end_of_text|>",
]


@pytest.fixture(scope="module")
def tokenizer():
    """Every byte: any text."""
    vocabulary, merges = train_byte_pair(CORPUS)
    return keras_hub.models.Llama3Tokenizer(vocabulary=vocabulary, merges=merges)


@pytest.fixture(scope="module")
def ascii_tokenizer():
    """The model's: every token is text on its own (og's decode ends a text at bytes that
    are no UTF-8, where keras_hub writes U+FFFD, and a random model picks such bytes)."""
    vocabulary, merges = train_byte_pair(CORPUS, ascii=True)
    return keras_hub.models.Llama3Tokenizer(vocabulary=vocabulary, merges=merges)


@pytest.fixture(scope="module")
def exported(ascii_tokenizer, tmp_path_factory):
    """A tiny Llama 3 CausalLM with the ASCII tokenizer's preprocessor, saved (verified)."""
    tokenizer = ascii_tokenizer
    backbone = keras_hub.models.Llama3Backbone(
        vocabulary_size=tokenizer.vocabulary_size(),
        num_layers=2,
        num_query_heads=4,
        hidden_dim=64,
        intermediate_dim=96,
        num_key_value_heads=2,
    )
    redraw(backbone, seed=2)  # a seed whose greedy text runs on past the prompts below
    preprocessor = keras_hub.models.Llama3CausalLMPreprocessor(tokenizer, sequence_length=48)
    causal_lm = keras_hub.models.Llama3CausalLM(backbone=backbone, preprocessor=preprocessor)
    folder = tmp_path_factory.mktemp("tokenizer") / "llama3"
    report = save_decoder(causal_lm, folder, max_length=64)
    assert report["passed"]
    return causal_lm, folder


def _with_tokenizer(folder, tokenizer, destination):
    """A copy of the exported folder holding `tokenizer`'s files."""
    shutil.copytree(folder, destination)
    files = tokenizer_files(SimpleNamespace(preprocessor=SimpleNamespace(tokenizer=tokenizer)))
    for name, content in files.items():
        (destination / name).write_text(json.dumps(content))
    return destination


@pytest.mark.parametrize("kind", ["all-bytes", "ascii"])
def test_og_encodes_and_decodes_as_keras_hub(tokenizer, ascii_tokenizer, exported, kind, tmp_path):
    folder = exported[1]
    if kind == "all-bytes":
        folder = _with_tokenizer(folder, tokenizer, tmp_path / "all-bytes")
    else:
        tokenizer = ascii_tokenizer
    og_tokenizer = og.Tokenizer(og.Model(str(folder)))
    for text in TEXTS if kind == "all-bytes" else TEXTS[:4]:
        ids = np.asarray(tokenizer(text))
        np.testing.assert_array_equal(og_tokenizer.encode(text), ids, err_msg=text)
        # og's decode leaves special tokens out, as keras_hub's generate() does (its
        # detokenize keeps them).
        plain = ids[~np.isin(ids, tokenizer.special_token_ids)]
        assert og_tokenizer.decode(ids.astype(np.int32)) == str(tokenizer.detokenize(plain))


def test_the_end_tokens_are_the_tokenizers(ascii_tokenizer, exported):
    tokenizer = ascii_tokenizer
    config = json.loads((exported[1] / "genai_config.json").read_text())["model"]
    assert config["eos_token_id"] == [tokenizer.end_token_id, tokenizer.end_token2_id]
    assert config["bos_token_id"] == tokenizer.start_token_id
    assert config["pad_token_id"] == tokenizer.pad_token_id


@pytest.mark.parametrize("prompt", ["the cat sat on", "a bird"])
def test_og_generator_writes_keras_hub_generate_text(exported, prompt):
    causal_lm, folder = exported
    causal_lm.compile(sampler="greedy")
    expected = causal_lm.generate(prompt, max_length=40)
    assert len(expected) > len(prompt) + 10  # generated text, not only the prompt
    assert og_greedy_text(causal_lm, folder, prompt, max_length=40) == expected


def test_a_sentencepiece_tokenizer_is_named_and_left_out(tmp_path):
    spm = pytest.importorskip("sentencepiece")
    import io

    proto = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(CORPUS.split(". ") * 4),
        model_writer=proto,
        vocab_size=40,
        model_type="bpe",
        pad_id=0,
        unk_id=1,
        bos_id=2,
        eos_id=3,
        minloglevel=2,
    )
    tokenizer = keras_hub.models.LlamaTokenizer(proto=proto.getvalue())
    backbone = keras_hub.models.LlamaBackbone(
        vocabulary_size=tokenizer.vocabulary_size(),
        num_layers=1,
        num_query_heads=2,
        hidden_dim=32,
        intermediate_dim=48,
        num_key_value_heads=1,
    )
    preprocessor = keras_hub.models.LlamaCausalLMPreprocessor(tokenizer)
    causal_lm = keras_hub.models.LlamaCausalLM(backbone=backbone, preprocessor=preprocessor)
    match = "no tokenizer files for LlamaTokenizer: .* no byte fallback"
    with pytest.warns(UserWarning, match=match):
        save_decoder(causal_lm, tmp_path / "llama", max_length=16, verify=False)
    assert not (tmp_path / "llama" / "tokenizer.json").exists()
    config = json.loads((tmp_path / "llama" / "genai_config.json").read_text())["model"]
    assert config["eos_token_id"] == tokenizer.end_token_id == 3
