"""A `.litertlm` bundle checked in LiteRT-LM's engine: its greedy text against keras_hub's.

The engine takes text, so each case is a prompt as text: keras_hub's
`generate(prompt, max_length=max_length, strip_prompt=True)` (compiled with the greedy
sampler) against the engine's session on the CPU backend with `top_k=1`, the bundle's
prompt template applied where it has one (`litertlm_template.py`: then keras_hub's
`generate()` of the ids the engine prefills, the templated texts tokenized as it does), both
generating until the stop token or the end of the cache. The prompts
are one shorter than the smallest `prefill_<n>` (the engine pads it), one longer than the
largest (the engine splits it over the signatures) and the longest the engine takes
(`max_length - 2`: its padded last chunk runs past `max_length`, into the slots the file
has for it), counted with the start token and the template's tokens.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable

from keras_posenc.export.decoder.litertlm_template import PromptTemplate, engine_ids

# A word's first piece: SentencePiece's `▁word`, byte-level BPE's `Ġword` (GPT-2's space).
_WORD_STARTS = ("\u2581", "\u0120")


def _words(tokenizer) -> list[str]:
    """Whole-word pieces of the vocabulary, to make prompts of a chosen length."""
    words = []
    for i in range(int(tokenizer.vocabulary_size())):
        piece = tokenizer.id_to_token(i)
        if piece.startswith(_WORD_STARTS) and piece[1:].isalnum():
            words.append(piece[1:])
    return words or ["a"]


def prompt_tokens(tokenizer, text: str, has_start: bool, template=None) -> int:
    """The tokens the engine prefills for prompt `text`: the start token, where the bundle
    has one, and the prompt with `template`'s texts (`litertlm_template.engine_ids`)."""
    return len(engine_ids(tokenizer, template, text, 0 if has_start else None))


def _prompt_of(tokenizer, words: list[str], tokens: int, has_start: bool, template) -> str:
    """A prompt of about `tokens` tokens with the start token and the template (at most
    that many): whole words while three more fit, then one letter at a time."""

    def count(text: str) -> int:
        return prompt_tokens(tokenizer, text, has_start, template)

    text, i = words[0], 1
    while count(f"{text} {words[i % len(words)]}") <= tokens and i < 4 * tokens:
        text, i = f"{text} {words[i % len(words)]}", i + 1
    while count(text + words[0][0]) <= tokens and len(text) < 8 * tokens:
        text += words[0][0]
    return text


def check_prompts(
    tokenizer, prefill_lengths: tuple[int, ...], max_length: int, has_start: bool, template=None
) -> list[str]:
    """The prompts of the module docstring: shorter than the smallest `prefill_<n>` (when
    it is over 2), longer than the largest, and the longest the engine takes
    (`max_length - 2` tokens: its last chunk's padding runs past `max_length`), those the
    cache holds with a token generated."""
    words, prompts = _words(tokenizer), []
    short = prompt_tokens(tokenizer, words[0], has_start, template)
    if prefill_lengths[0] > 2 and short <= max_length - 2:
        prompts.append(words[0])
    for tokens in (prefill_lengths[-1] + 2, max_length - 2):
        prompt = _prompt_of(tokenizer, words, tokens, has_start, template)
        if (
            prompt_tokens(tokenizer, prompt, has_start, template) > prefill_lengths[-1]
            and prompt not in prompts
        ):
            prompts.append(prompt)
    return prompts


def keras_hub_text(
    causal_lm, max_length: int, template: PromptTemplate | None = None, stops=()
) -> Callable[[str], str]:
    """`prompt -> text`: keras_hub's greedy `generate()` after the prompt; with `template`,
    `generate()` of the ids the engine prefills (`engine_ids`), up to `stops`."""
    causal_lm.compile(sampler="greedy")
    if template is None:
        return lambda prompt: str(
            causal_lm.generate(prompt, max_length=max_length, strip_prompt=True)
        )
    preprocessor = causal_lm.preprocessor
    start = getattr(preprocessor.tokenizer, "start_token_id", None)

    def text(prompt: str) -> str:
        import numpy as np

        ids = engine_ids(preprocessor.tokenizer, template, prompt, start)
        padding = max_length - len(ids)
        inputs = {
            "token_ids": np.asarray([ids + [0] * padding], np.int32),
            "padding_mask": np.asarray([[True] * len(ids) + [False] * padding]),
        }
        # generate() takes ids only without a preprocessor; its postprocess gives the text.
        causal_lm.preprocessor = None
        try:
            out = causal_lm.generate(
                inputs, max_length=max_length, stop_token_ids=list(stops), strip_prompt=True
            )
        finally:
            causal_lm.preprocessor = preprocessor
        value = np.asarray(preprocessor.generate_postprocess(out)).reshape(-1)[0]
        return value.decode("utf-8") if isinstance(value, bytes) else str(value)

    return text


def step_model_text(
    step_model, tokenizer, start: int | None, stops, max_length: int, template=None
) -> Callable[[str], str]:
    """`prompt -> text` for a `decoder_models` step model, as keras_hub's `generate()`
    makes it: the prompt's ids after the start token (where there is one; with `template`,
    the ids the engine prefills, `engine_ids`), Keras's greedy
    tokens (`keras_greedy`) until a stop token or `max_length` tokens in all, then the
    tokenizer's text of those tokens with its special tokens left out."""
    import numpy as np

    from keras_posenc.export.decoder.greedy_generation import keras_greedy

    special = set(int(i) for i in getattr(tokenizer, "special_token_ids", []))

    def text(prompt: str) -> str:
        ids = engine_ids(tokenizer, template, prompt, start)
        prompts = np.asarray([ids], np.int32)
        steps = max_length - len(ids) - 1
        tokens = keras_greedy(step_model, prompts, np.ones_like(prompts), steps)[0][0]
        generated = []
        for token in (int(t) for t in tokens):
            if token in stops:
                break
            generated.append(token)
        shown = [t for t in generated if t not in special]
        value = np.asarray(tokenizer.detokenize(shown)).item() if shown else ""
        return value.decode("utf-8") if isinstance(value, bytes) else str(value)

    return text


def litertlm_reference(model, plan) -> Callable[[str], str]:
    """`prompt -> text` the bundle's check compares with: keras_hub's `generate()`, or
    Keras's greedy tokens of a step model in its tokenizer's text."""
    from keras_posenc import keras_hub as bridge  # here: the bridge imports this package

    template, stops = plan.prompt_template, plan.stop_tokens
    if bridge.is_keras_hub_causal_lm(model):
        return keras_hub_text(model, plan.max_length, template, stops)
    tokenizer, start = plan.keras_tokenizer, plan.start_token
    return step_model_text(model, tokenizer, start, stops, plan.max_length, template)


def check_litertlm(path, reference, plan) -> dict:
    """`{"cases": [...], "passed": bool}`: each prompt's text from Keras and the engine
    (`"keras_hub"`: the reference's text, Keras's for a step model).

    Args:
        path: the `.litertlm` file.
        reference: `prompt -> text` (`keras_hub_text` or `step_model_text`).
        plan: the bundle's `BundlePlan` (its keras_hub tokenizer, start token, prefill
            lengths and max_length).

    Raises:
        RuntimeError: the engine refused the bundle (its message is in the log above).
    """
    import litert_lm

    litert_lm.set_min_log_severity(litert_lm.LogSeverity.ERROR)
    tokenizer, max_length = plan.keras_tokenizer, plan.max_length
    has_start, template = plan.start_token is not None, plan.prompt_template
    prompts = check_prompts(tokenizer, plan.prefill_lengths, max_length, has_start, template)
    cases, greedy = [], litert_lm.SamplerConfig(top_k=1)
    # The engine writes its XNNPACK weight cache beside the model unless told where.
    with (
        tempfile.TemporaryDirectory(prefix="keras_posenc_litertlm_cache_") as cache,
        litert_lm.Engine(str(path), max_num_tokens=max_length, cache_dir=cache) as engine,
    ):
        for prompt in prompts:
            expected = reference(prompt)
            with engine.create_session(
                apply_prompt_template=template is not None, sampler_config=greedy
            ) as session:
                session.run_prefill([prompt])
                got = session.run_decode().texts[0]
            cases.append(
                {
                    "prompt": prompt,
                    "prompt_tokens": prompt_tokens(tokenizer, prompt, has_start, template),
                    "keras_hub": expected,
                    "litert_lm": got,
                    "equal": got == expected,
                }
            )
    return {"cases": cases, "passed": bool(cases) and all(c["equal"] for c in cases)}


def litertlm_failure(report: dict) -> str | None:
    """None when the engine's text equals keras_hub's for every prompt (or no bundle was
    checked) and a quantized bundle's .tflite passed; otherwise what failed first."""
    result = report.get("litertlm")
    if result is None or result["passed"]:
        return None
    tflite = result.get("tflite")  # a quantized bundle's .tflite (`litertlm_quantized.py`)
    if tflite is not None and not tflite["passed"]:
        from keras_posenc.export.decoder.check import failure_message

        return f"The bundle's .tflite: {failure_message(tflite)}"
    if not result["cases"]:
        return "The LiteRT-LM bundle was not checked: max_length leaves no room for a prompt."
    case = next(c for c in result["cases"] if not c["equal"])
    return (
        f"LiteRT-LM's engine does not generate Keras's text for the prompt of "
        f"{case['prompt_tokens']} tokens: {case['litert_lm']!r} instead of {case['keras_hub']!r}."
    )
