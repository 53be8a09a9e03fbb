"""`save_decoder(step, ..., formats=("litertlm",), tokenizer=...)`: a `decoder_models` step
model, which has no preprocessor, bundled with the keras_hub tokenizer passed with it, and
the bad input of a bundle (a tokenizer that does not fit, a `max_length` it cannot hold)
refused by name with nothing written.

The reference is Keras's greedy generation through the step model, its tokens in the
tokenizer's text as keras_hub's `generate()` makes it (the prompt after the start token,
up to a stop token, special tokens left out); the engine runs the bundle from the same
prompt as text.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
from tiny_byte_pair import CORPUS, train_byte_pair
from tiny_sentencepiece import LLAMA, sentencepiece_proto, tiny_llama_with_tokenizer

from keras_posenc import DecoderBlock, decoder_models
from keras_posenc.export import ExportError, save_decoder
from keras_posenc.export.decoder.entry import LONGEST
from keras_posenc.export.decoder.greedy_generation import keras_greedy

litert_lm = pytest.importorskip("litert_lm")
pytest.importorskip("litert_lm_builder")
import keras_hub  # noqa: E402  (after the skips: the bundle needs LiteRT-LM)

MAX_LENGTH = 44
PROMPT = "the quick brown fox jumps over the lazy dog"


def tiny_step_model(vocabulary: int, max_length: int = MAX_LENGTH, seed: int = 0):
    """A 2-layer step model of `vocabulary` tokens (weights N(0, 1/fan_in), seeded)."""
    keras.utils.set_random_seed(seed)
    blocks = [DecoderBlock(16, 4, 2, 96, name=f"b{i}") for i in range(2)]
    embedding = keras.layers.Embedding(vocabulary, 64, embeddings_initializer="normal")
    head = keras.layers.Dense(vocabulary, use_bias=False)
    norm = keras.layers.RMSNormalization()
    return decoder_models(embedding, blocks, norm, head, max_length=max_length)[1]


@pytest.fixture(scope="module")
def tokenizer():
    """keras_hub's plain SentencePieceTokenizer (it names no start or end token: the
    bundle reads them from its model, `<s>` 1 and `</s>` 2)."""
    return keras_hub.tokenizers.SentencePieceTokenizer(proto=sentencepiece_proto(LLAMA))


def test_a_step_model_with_its_tokenizer_generates_keras_text(tokenizer, tmp_path):
    step = tiny_step_model(tokenizer.vocabulary_size())
    folder = tmp_path / "step"
    report = save_decoder(
        step, folder, max_length=MAX_LENGTH, formats=("litertlm",), tokenizer=tokenizer, verbose=0
    )
    cases = report["litertlm"]["cases"]
    tokens = [case["prompt_tokens"] for case in cases]
    assert min(tokens) < 8 and MAX_LENGTH - 2 in tokens, tokens
    for case in cases:
        assert case["keras_hub"] and case["litert_lm"] == case["keras_hub"], case
    # The reference, again by hand: Keras's greedy tokens after <s> and the prompt's ids.
    ids = [1, *(int(i) for i in np.asarray(tokenizer(PROMPT)))]
    prompts = np.asarray([ids], np.int32)
    greedy = keras_greedy(step, prompts, np.ones_like(prompts), MAX_LENGTH - len(ids) - 1)[0][0]
    generated = [int(t) for t in greedy]
    generated = generated[: generated.index(2)] if 2 in generated else generated
    expected = np.asarray(tokenizer.detokenize(generated)).item()
    expected = expected.decode("utf-8") if isinstance(expected, bytes) else str(expected)
    with litert_lm.Engine(str(folder / "model.litertlm"), cache_dir=str(tmp_path)) as engine:
        assert engine.bos_token_id == 1 and engine.eos_token_ids == [[2]]
        config = litert_lm.SamplerConfig(top_k=1)
        with engine.create_session(apply_prompt_template=False, sampler_config=config) as session:
            session.run_prefill([PROMPT])
            assert session.run_decode().texts[0] == expected


def _refused(model, folder, match, error=ExportError, max_length=MAX_LENGTH, **options):
    with pytest.raises(error, match=match):
        save_decoder(
            model, folder, max_length=max_length, formats=("litertlm",), verbose=0, **options
        )
    assert not folder.exists()


def test_bad_input_is_refused_by_name_and_nothing_written(tokenizer, tmp_path):
    size = tokenizer.vocabulary_size()
    step = tiny_step_model(size)
    _refused(step, tmp_path / "a", "pass the keras_hub tokenizer its ids are of, `tokenizer=`")
    wider = tiny_step_model(size + 3)
    _refused(
        wider,
        tmp_path / "b",
        rf"tokenizer has {size} tokens and the model's embedding {size + 3}",
        tokenizer=tokenizer,
    )
    causal_lm = tiny_llama_with_tokenizer()
    _refused(
        causal_lm,
        tmp_path / "c",
        "tokenizer= is for decoder_models step models",
        ValueError,
        tokenizer=tokenizer,
    )
    with pytest.raises(ValueError, match=r"tokenizer= is written only into"):
        save_decoder(step, tmp_path / "d", max_length=MAX_LENGTH, tokenizer=tokenizer, verbose=0)
    assert not (tmp_path / "d").exists()
    # The reference generates max_length tokens: a step model's cache must hold them.
    _refused(
        step,
        tmp_path / "e",
        r"cache holds 44 tokens .* max_length \(60\)",
        ValueError,
        max_length=60,
        tokenizer=tokenizer,
    )
    # The cache holds max_length and the longest prefill's padding: past 2^24 slots in all.
    _refused(
        causal_lm,
        tmp_path / "f",
        rf"max_length {LONGEST - 8} is more than a .litertlm",
        ValueError,
        max_length=LONGEST - 8,
        verify=False,
    )
    _refused(
        causal_lm,
        tmp_path / "g",
        r"prefill_lengths must be lengths from 1 to max_length \(43\)",
        ValueError,
        prefill_lengths=(8, MAX_LENGTH),
    )
    # A plain BytePairTokenizer names no end token (keras_hub's family tokenizers do).
    vocabulary, merges = train_byte_pair(CORPUS, ascii=True)
    plain = keras_hub.tokenizers.BytePairTokenizer(vocabulary=vocabulary, merges=merges)
    _refused(
        tiny_step_model(len(vocabulary)),
        tmp_path / "h",
        "BytePairTokenizer has no end token",
        tokenizer=plain,
    )
