"""`save_decoder(..., formats=("litertlm",))` for keras_hub's byte-level BPE tokenizers: the
bundle holds a `tokenizer.json`, and LiteRT-LM's engine generates keras_hub's greedy text.

The references are keras_hub's: `generate()` (greedy sampler) of a tiny random Llama 3 (a
start token, two end tokens) and Qwen3 (no start token), and the keras_hub tokenizer's
ids and text. Their tokenizers are byte-level BPEs trained here (`tiny_byte_pair`) on
printable ASCII, so every generated token is text on its own.
"""

from __future__ import annotations

import re

import keras_hub
import numpy as np
import pytest
from tiny_byte_pair import CORPUS, SPECIALS, train_byte_pair

from keras_posenc.export import ExportError, save_decoder

litert_lm = pytest.importorskip("litert_lm")
pytest.importorskip("litert_lm_builder")

MAX_LENGTH = 44  # as tests/test_decoder_litertlm.py: prompts padded and chunked
QWEN_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# keras_hub's SmolLM3Tokenizer requires its end, start and thinking tokens.
SMOLLM3_SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<think>", "</think>", "<|im_end|>"]
TEXTS = [
    "the cat sat on the mat.",
    "hello world\n\nthe end",
    "a bird sang 12 songs in 2024; ok",
    "the cat<|eot_id|> sat<|im_end|> on",
]


# Each family's tokenizer class, the special tokens it requires and its backbone's options.
FAMILIES = {
    "llama3": ("Llama3", {}, {}),
    "qwen3": ("Qwen3", {"specials": QWEN_SPECIALS}, dict(head_dim=16, tie_word_embeddings=False)),
    # NoPE in every fourth layer, as SmolLM3's; q/k/v biases.
    "smollm3": (
        "SmolLM3",
        {"specials": SMOLLM3_SPECIALS},
        dict(
            num_attention_heads=4,
            attention_bias=True,
            attention_dropout=0.0,
            rope_layer_enabled_list=[True, True, True, False],
            layer_types=["full_attention"] * 4,
            mlp_bias=False,
            layer_norm_epsilon=1e-6,
            max_position_embeddings=64,
            rope_theta=10000.0,
            partial_rotary_factor=1.0,
            num_layers=4,
        ),
    ),
}


def tiny_byte_pair_causal_lm(family: str, extra_rows: int = 0, seed: int = 2):
    """A 2-layer Llama 3 or Qwen3 (4-layer SmolLM3) CausalLM with a tiny ASCII byte-level
    BPE tokenizer; `extra_rows` embedding rows more than the tokenizer has tokens."""
    from keras_hub_models import redraw, redraw_2026

    prefix, specials, options = FAMILIES[family]
    vocabulary, merges = train_byte_pair(CORPUS, ascii=True, **specials)
    tokenizer = getattr(keras_hub.models, f"{prefix}Tokenizer")(
        vocabulary=vocabulary, merges=merges
    )
    shape = dict(
        vocabulary_size=tokenizer.vocabulary_size() + extra_rows,
        num_layers=2,
        hidden_dim=64,
        intermediate_dim=96,
        num_key_value_heads=2,
    )
    if family != "smollm3":
        shape["num_query_heads"] = 4
    backbone = getattr(keras_hub.models, f"{prefix}Backbone")(**{**shape, **options})
    # seed 2: texts that run on past the prompts; SmolLM3's norms multiply by their scale.
    (redraw_2026 if family == "smollm3" else redraw)(backbone, seed)
    preprocessor = getattr(keras_hub.models, f"{prefix}CausalLMPreprocessor")(
        tokenizer, sequence_length=64
    )
    causal_lm_class = getattr(keras_hub.models, f"{prefix}CausalLM")
    return causal_lm_class(backbone=backbone, preprocessor=preprocessor)


@pytest.fixture(scope="module", params=["llama3", "qwen3", "smollm3"])
def exported(request, tmp_path_factory):
    causal_lm = tiny_byte_pair_causal_lm(request.param)
    folder = tmp_path_factory.mktemp("litertlm_byte_pair") / request.param
    report = save_decoder(
        causal_lm, folder, max_length=MAX_LENGTH, formats=("litertlm",), verbose=0
    )
    return causal_lm, folder / "model.litertlm", report


def test_the_engine_generates_keras_hub_text(exported):
    causal_lm, _, report = exported
    cases = report["litertlm"]["cases"]
    tokens = [case["prompt_tokens"] for case in cases]
    assert min(tokens) < 8 and any(32 < n < MAX_LENGTH - 2 for n in tokens), tokens
    assert MAX_LENGTH - 2 in tokens, tokens
    for case in cases:
        assert case["keras_hub"], case  # a text to compare, not two empty ones
        assert case["litert_lm"] == case["keras_hub"], case
    # Counted as keras_hub's preprocessor counts: the start token where there is one.
    tokenizer = causal_lm.preprocessor.tokenizer
    packed = causal_lm.preprocessor.generate_preprocess([cases[0]["prompt"]], MAX_LENGTH)
    assert int(np.sum(packed["padding_mask"])) == cases[0]["prompt_tokens"], tokenizer


def test_the_engine_tokenizes_as_keras_hub(exported, tmp_path):
    """The bundle's tokenizer.json in the engine: keras_hub's ids for each text (special
    tokens written in the text too), and keras_hub's `generate()` text for ids (special
    tokens left out, the start token kept: the engine prefixes prompts with its text)."""
    causal_lm, path, _ = exported
    tokenizer = causal_lm.preprocessor.tokenizer
    start, ends = tokenizer.start_token_id, [tokenizer.end_token_id]
    if getattr(tokenizer, "end_token2_id", None) is not None:
        ends.append(tokenizer.end_token2_id)
    with litert_lm.Engine(str(path), cache_dir=str(tmp_path)) as engine:
        assert engine.bos_token_id == start
        assert engine.eos_token_ids == [[end] for end in ends]
        for text in TEXTS:
            ids = [int(i) for i in tokenizer(text)]
            assert engine.tokenize(text) == ids, text
            shown = [i for i in ids if i not in tokenizer.special_token_ids]
            assert engine.detokenize(ids) == str(tokenizer.detokenize(shown)), text
        if start is not None:
            assert engine.detokenize([start]) == tokenizer.start_token


def _refused(model, folder, match):
    with pytest.raises(ExportError, match=match):
        save_decoder(model, folder, max_length=MAX_LENGTH, formats=("litertlm",), verbose=0)
    assert not folder.exists()


def test_bad_tokenizers_are_refused_by_name(tmp_path, monkeypatch):
    wider = tiny_byte_pair_causal_lm("qwen3", extra_rows=3)
    _refused(wider, tmp_path / "a", r"tokenizer has \d+ tokens and the model's embedding")
    causal_lm = tiny_byte_pair_causal_lm("llama3")
    size = causal_lm.preprocessor.tokenizer.vocabulary_size()
    monkeypatch.setattr(causal_lm.preprocessor.tokenizer, "end_token2_id", size + 5)
    _refused(causal_lm, tmp_path / "b", rf"token ids \[{size + 5}\] are outside the vocabulary")


def test_a_vocabulary_with_ids_past_the_embedding_is_refused(tmp_path):
    """As many tokens as the embedding has rows, but an id past them (a gap in the ids):
    the bundle's tokenizer would give the model a token it has no row for."""
    vocabulary, merges = train_byte_pair(CORPUS, ascii=True)
    last = max((t for t in vocabulary if t not in SPECIALS), key=vocabulary.get)
    vocabulary[last] = len(vocabulary) + 2  # the specials keep their ids, past it
    tokenizer = keras_hub.models.Llama3Tokenizer(vocabulary=vocabulary, merges=merges)
    causal_lm = tiny_byte_pair_causal_lm("llama3")
    assert tokenizer.vocabulary_size() == causal_lm.backbone.vocabulary_size
    causal_lm.preprocessor.tokenizer = tokenizer
    _refused(causal_lm, tmp_path / "out", rf"token id {vocabulary[last]} \({re.escape(last)}\)")
