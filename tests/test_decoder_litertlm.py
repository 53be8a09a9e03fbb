"""`save_decoder(..., formats=("litertlm",))`: a LiteRT-LM bundle that LiteRT-LM's own engine
runs to keras_hub's greedy text, its refusals, and the plain LiteRT file left as it was.

The reference is keras_hub's `generate()` (greedy sampler) on a tiny random Llama whose
preprocessor holds a SentencePiece model trained here; the engine runs the bundle on this
CPU with `top_k=1` from the same prompt as text.
"""

from __future__ import annotations

import numpy as np
import pytest
from tiny_sentencepiece import tiny_gemma3_with_tokenizer, tiny_llama_with_tokenizer

from keras_posenc.export import ExportError, save_decoder
from keras_posenc.export.decoder import check
from keras_posenc.export.decoder.litert_decoder import decoder_litert
from keras_posenc.export.decoder.litert_runner import causal_mask
from keras_posenc.export.decoder.litertlm_model import decoder_litertlm_tflite
from keras_posenc.export.litert import litert_interpreter

litert_lm = pytest.importorskip("litert_lm")
pytest.importorskip("litert_lm_builder")

# Not a multiple of 32: the longest prompt's padded last chunk runs past max_length.
MAX_LENGTH = 44
# Longer than prefill_32 with the start token: the engine splits it over the signatures.
LONG_PROMPT = "the quick brown fox jumps over the lazy dog"  # 36 tokens


@pytest.fixture(scope="module")
def causal_lm():
    return tiny_llama_with_tokenizer()


@pytest.fixture(scope="module")
def bundle(causal_lm, tmp_path_factory):
    folder = tmp_path_factory.mktemp("litertlm") / "bundle"
    report = save_decoder(
        causal_lm, folder, max_length=MAX_LENGTH, formats=("litertlm",), verbose=0
    )
    return folder, report


def test_the_engine_generates_keras_hub_text(bundle):
    folder, report = bundle
    written = sorted(p.name for p in folder.iterdir() if not p.name.startswith("."))
    assert written == ["model.litertlm", "verification.json"]  # no engine cache left there
    cases = report["litertlm"]["cases"]
    tokens = [case["prompt_tokens"] for case in cases]
    assert min(tokens) < 8 and any(32 < n < MAX_LENGTH - 2 for n in tokens), tokens
    assert MAX_LENGTH - 2 in tokens, tokens  # the longest prompt the engine takes
    for case in cases:
        assert case["keras_hub"], case  # a text to compare, not two empty ones
        assert case["litert_lm"] == case["keras_hub"], case


def test_the_bundle_runs_as_written(bundle, causal_lm, tmp_path):
    """The written file in a fresh engine, apart from `save_decoder`'s own check."""
    folder, _ = bundle
    causal_lm.compile(sampler="greedy")
    assert 32 < len(causal_lm.preprocessor.tokenizer(LONG_PROMPT)) + 1 < MAX_LENGTH - 1
    expected = causal_lm.generate(LONG_PROMPT, max_length=MAX_LENGTH, strip_prompt=True)
    path = str(folder / "model.litertlm")
    with litert_lm.Engine(path, max_num_tokens=MAX_LENGTH, cache_dir=str(tmp_path)) as engine:
        assert engine.bos_token_id == 1 and engine.eos_token_ids == [[2]]
        config = litert_lm.SamplerConfig(top_k=1)
        with engine.create_session(apply_prompt_template=False, sampler_config=config) as session:
            session.run_prefill([LONG_PROMPT])
            got = session.run_decode().texts[0]
    assert got == str(expected)


def test_gemma3_bundle_generates_keras_hub_text(tmp_path):
    """Gemma 3: SentencePiece, interleaved local (window 16) and global layers, query/key
    norms, scaled embeddings; prompts past the window, chunked and padded."""
    causal_lm = tiny_gemma3_with_tokenizer()
    backbone = causal_lm.backbone
    assert backbone.use_sliding_window_attention and backbone.use_query_key_norm
    window = backbone.sliding_window_size
    report = save_decoder(
        causal_lm, tmp_path / "gemma3", max_length=MAX_LENGTH, formats=("litertlm",), verbose=0
    )
    cases = report["litertlm"]["cases"]
    tokens = [case["prompt_tokens"] for case in cases]
    assert min(tokens) < 8 and max(tokens) == MAX_LENGTH - 2 and 32 > window, tokens
    for case in cases:
        assert case["keras_hub"], case
        assert case["litert_lm"] == case["keras_hub"], case


def _prefill(data: bytes, signature: str, tokens: np.ndarray) -> dict:
    runner = litert_interpreter(data).get_signature_runner(signature)
    details = runner.get_input_details()
    caches = {
        name: np.zeros((1, *d["shape_signature"][1:]), np.float32)
        for name, d in details.items()
        if name.startswith("kv_cache_")
    }
    input_pos = np.arange(tokens.shape[1], dtype=np.int32)
    padding = np.ones((1, MAX_LENGTH), np.int32)
    return runner(
        tokens=tokens, input_pos=input_pos, mask=causal_mask(padding, input_pos), **caches
    )


def test_static_signatures_and_the_plain_file(causal_lm):
    """The bundle's model: batch 1, static prefill_8 / prefill_32 (`input_pos` one slot
    per token) and decode, int32 inputs, the plain file's logits and caches; the plain
    file keeps its dynamic `prefill` and `decode`."""
    from keras_posenc import keras_hub as bridge

    decoder = bridge.describe_causal_lm(causal_lm, MAX_LENGTH)
    static, plain = decoder_litertlm_tflite(decoder, (32, 8)), decoder_litert(decoder)
    signatures = litert_interpreter(static).get_signature_list()
    assert sorted(signatures) == ["decode", "prefill_32", "prefill_8"]
    for name, length in [("prefill_8", 8), ("prefill_32", 32), ("decode", 1)]:
        runner = litert_interpreter(static).get_signature_runner(name)
        for input_name, d in runner.get_input_details().items():
            assert -1 not in d["shape_signature"], input_name
            assert input_name == "input_pos" or d["shape_signature"][0] == 1, input_name
        inputs = runner.get_input_details()
        assert list(inputs["tokens"]["shape"]) == [1, length]
        assert list(inputs["input_pos"]["shape"]) == [length]
        assert inputs["tokens"]["dtype"] == np.int32 and inputs["input_pos"]["dtype"] == np.int32
    assert sorted(litert_interpreter(plain).get_signature_list()) == ["decode", "prefill"]
    prefill = litert_interpreter(plain).get_signature_runner("prefill").get_input_details()
    assert list(prefill["tokens"]["shape_signature"]) == [-1, -1]
    tokens = np.random.default_rng(0).integers(3, decoder.vocabulary, (1, 8)).astype(np.int32)
    got, expected = _prefill(static, "prefill_8", tokens), _prefill(plain, "prefill", tokens)
    assert sorted(got) == sorted(expected)
    for name, value in got.items():
        scale = np.sqrt(np.mean(np.square(expected[name]), axis=-1, keepdims=True))
        assert np.all(np.abs(value - expected[name]) <= check.ATOL + check.RTOL * scale), name


def _refused(model, folder, match, error=ExportError, **options):
    with pytest.raises(error, match=match):
        save_decoder(
            model, folder, max_length=MAX_LENGTH, formats=("litertlm",), verbose=0, **options
        )
    assert not folder.exists()


def test_refusals_name_the_problem_and_write_nothing(causal_lm, tmp_path, monkeypatch):
    from keras_hub_models import tiny_causal_lm
    from test_decoder_save import step_model

    _refused(step_model(), tmp_path / "a", "decoder_models step model has none")
    _refused(tiny_causal_lm("llama"), tmp_path / "b", "it has no preprocessor")
    wider = tiny_llama_with_tokenizer(extra_rows=3)
    _refused(wider, tmp_path / "c", r"tokenizer has \d+ tokens and the model's embedding")
    _refused(
        causal_lm,
        tmp_path / "d",
        "prefill_lengths must be",
        ValueError,
        prefill_lengths=(8, MAX_LENGTH),
    )
    monkeypatch.setattr(causal_lm.preprocessor.tokenizer, "end_token_id", 1000)
    _refused(causal_lm, tmp_path / "e", r"token ids \[1000\] are outside the vocabulary")


def test_a_tokenizer_of_another_kind_is_refused_by_name(tmp_path):
    import keras_hub

    vocabulary = ["[PAD]", "[UNK]", "the", "fox"]
    word_piece = keras_hub.tokenizers.WordPieceTokenizer(vocabulary=vocabulary)
    causal_lm = tiny_llama_with_tokenizer()  # a fresh one: a built preprocessor takes no layer
    causal_lm.preprocessor.tokenizer = word_piece
    _refused(causal_lm, tmp_path / "out", "WordPieceTokenizer is neither")
