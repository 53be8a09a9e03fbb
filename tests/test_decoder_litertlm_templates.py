"""`save_decoder(..., formats=("litertlm",), prompt_template=...)`: LlmMetadata's
`prompt_templates` in the bundle, applied by LiteRT-LM's engine and by the check.

keras_hub's presets carry no template, so the user gives one (roles to prefix / suffix,
as LiteRT-LM's `PromptTemplates`). The engine's session with the template on tokenizes the
user prefix and the prompt, then the user suffix and the model prefix, apart; the check
compares its greedy text with keras_hub's `generate()` of those ids. Where the templated
text tokenizes to the same ids as a whole, that is `generate()` of the templated prompt,
which the tests compute independently; where it does not, the check follows the engine.
Bad templates are refused by name with nothing written.
"""

from __future__ import annotations

import numpy as np
import pytest
from tiny_sentencepiece import tiny_llama_with_tokenizer

from keras_posenc.export import save_decoder
from keras_posenc.export.decoder.litertlm_runner import bundle_section

litert_lm = pytest.importorskip("litert_lm")
pytest.importorskip("litert_lm_builder")

MAX_LENGTH = 44
# Words of the tiny tokenizer's corpus, each after a space: the templated prompt tokenizes
# to the same ids whole or in the engine's two texts.
TEMPLATE = {"user": {"prefix": "the ", "suffix": " dog"}, "model": {"prefix": " lazy"}}


def _templated(prompt: str, template: dict = TEMPLATE) -> str:
    user, model = template["user"], template.get("model", {})
    return user.get("prefix", "") + prompt + user.get("suffix", "") + model.get("prefix", "")


@pytest.fixture(scope="module")
def causal_lm():
    causal_lm = tiny_llama_with_tokenizer()
    causal_lm.compile(sampler="greedy")
    return causal_lm


@pytest.fixture(scope="module")
def bundle(causal_lm, tmp_path_factory):
    folder = tmp_path_factory.mktemp("templates") / "bundle"
    report = save_decoder(
        causal_lm,
        folder,
        max_length=MAX_LENGTH,
        formats=("litertlm",),
        prompt_template=TEMPLATE,
        verbose=0,
    )
    return folder / "model.litertlm", report


def _engine_text(path, prompt: str, cache, template: bool, max_length: int = MAX_LENGTH) -> str:
    with litert_lm.Engine(str(path), max_num_tokens=max_length, cache_dir=str(cache)) as engine:
        config = litert_lm.SamplerConfig(top_k=1)
        with engine.create_session(apply_prompt_template=template, sampler_config=config) as s:
            s.run_prefill([prompt])
            return s.run_decode().texts[0]


def test_the_engine_applies_the_template_to_keras_hubs_text(bundle, causal_lm):
    _, report = bundle
    cases = report["litertlm"]["cases"]
    tokens = [case["prompt_tokens"] for case in cases]
    assert any(n > 32 for n in tokens) and MAX_LENGTH - 2 in tokens, tokens  # chunked
    tokenizer = causal_lm.preprocessor.tokenizer
    for case in cases:
        prompt, whole = case["prompt"], _templated(case["prompt"])
        # The precondition of comparing with generate() of the text: the same ids.
        apart = [*tokenizer(TEMPLATE["user"]["prefix"] + prompt), *tokenizer(" dog lazy")]
        assert [int(i) for i in tokenizer(whole)] == [int(i) for i in apart], prompt
        expected = str(causal_lm.generate(whole, max_length=MAX_LENGTH, strip_prompt=True))
        assert expected and case["litert_lm"] == expected == case["keras_hub"], case


def test_the_bundle_holds_the_template(bundle, causal_lm, tmp_path):
    """LlmMetadata's fields, and a fresh engine: template on, keras_hub's text of the
    templated prompt; off, that of the prompt alone (a different text)."""
    from litert_lm_builder.runtime.proto import llm_metadata_pb2

    path, _ = bundle
    metadata = llm_metadata_pb2.LlmMetadata.FromString(bundle_section(path, "LlmMetadataProto"))
    templates = metadata.prompt_templates
    assert (templates.user.prefix, templates.user.suffix) == ("the ", " dog")
    assert (templates.model.prefix, templates.model.suffix) == (" lazy", "")
    assert not metadata.HasField("jinja_prompt_template")  # the engine derives one
    prompt = "quick brown fox"
    on = _engine_text(path, prompt, tmp_path, template=True)
    off = _engine_text(path, prompt, tmp_path, template=False)
    generate = causal_lm.generate
    assert on == str(generate(_templated(prompt), max_length=MAX_LENGTH, strip_prompt=True))
    assert off == str(generate(prompt, max_length=MAX_LENGTH, strip_prompt=True))
    assert on != off


def test_the_check_tokenizes_the_templates_texts_apart_as_the_engine(causal_lm, tmp_path):
    """A suffix that joins the prompt's last word when tokenized whole: the engine
    tokenizes it apart, and so does the check, which passes; keras_hub's `generate()` of
    the whole templated text gives another text."""
    template = {"user": {"suffix": "dog"}}
    report = save_decoder(
        causal_lm,
        tmp_path / "apart",
        max_length=20,
        formats=("litertlm",),
        prompt_template=template,
        verbose=0,
    )
    cases = report["litertlm"]["cases"]
    assert report["litertlm"]["passed"] and all(case["equal"] for case in cases)
    tokenizer, prompt = causal_lm.preprocessor.tokenizer, "quick brown fox"
    whole = np.asarray(tokenizer(prompt + "dog"))
    apart = np.concatenate([tokenizer(prompt), tokenizer("dog")])
    assert whole.tolist() != apart.tolist()  # the two ways differ for this prompt
    path = tmp_path / "apart" / "model.litertlm"
    got = _engine_text(path, prompt, tmp_path, template=True, max_length=20)
    ids = [1, *apart.tolist()]
    inputs = {
        "token_ids": np.asarray([ids + [0] * (20 - len(ids))], np.int32),
        "padding_mask": np.asarray([[True] * len(ids) + [False] * (20 - len(ids))]),
    }
    preprocessor, causal_lm.preprocessor = causal_lm.preprocessor, None
    try:
        out = causal_lm.generate(inputs, max_length=20, stop_token_ids=[2], strip_prompt=True)
    finally:
        causal_lm.preprocessor = preprocessor
    expected = np.asarray(preprocessor.generate_postprocess(out)).reshape(-1)[0]
    expected = expected.decode() if isinstance(expected, bytes) else str(expected)
    assert got == expected
    whole_text = str(causal_lm.generate(prompt + "dog", max_length=20, strip_prompt=True))
    assert got != whole_text


@pytest.mark.parametrize(
    "template,error,match",
    [
        ("<start_of_turn>", TypeError, "prompt_template must be a mapping of roles"),
        ({"assistant": {"prefix": "a"}}, ValueError, "has role 'assistant'"),
        ({"user": "a"}, TypeError, r"prompt_template\['user'\] must be a mapping"),
        ({"user": {"start": "a"}}, ValueError, r"prompt_template\['user'\] has 'start'"),
        ({"user": {"prefix": 1}}, TypeError, r"\['user'\]\['prefix'\] must be a string"),
        ({"user": {"prefix": ""}}, ValueError, "prompt_template has no text"),
        ({"user": {"prefix": "the " * 40}}, ValueError, "leaves no room for a prompt"),
    ],
)
def test_bad_templates_are_refused_by_name(causal_lm, tmp_path, template, error, match):
    with pytest.raises(error, match=match):
        save_decoder(
            causal_lm,
            tmp_path / "t",
            max_length=MAX_LENGTH,
            formats=("litertlm",),
            prompt_template=template,
            verbose=0,
        )
    assert not (tmp_path / "t").exists()


def test_a_template_without_a_bundle_is_refused(causal_lm, tmp_path):
    with pytest.raises(ValueError, match=r"prompt_template= is written only into"):
        save_decoder(causal_lm, tmp_path / "o", max_length=MAX_LENGTH, prompt_template=TEMPLATE)
    assert not (tmp_path / "o").exists()
