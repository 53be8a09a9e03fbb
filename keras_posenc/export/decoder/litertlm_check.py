"""A `.litertlm` bundle checked in LiteRT-LM's engine: its greedy text against keras_hub's.

The engine takes text, so each case is a prompt as text: keras_hub's
`generate(prompt, max_length=max_length, strip_prompt=True)` (compiled with the greedy
sampler) against the engine's session on the CPU backend with `top_k=1`, prompt
template off, both generating until the stop token or the end of the cache. The prompts
are one shorter than the smallest `prefill_<n>` (the engine pads it), one longer than the
largest (the engine splits it over the signatures) and the longest the engine takes
(`max_length - 2`: its padded last chunk runs past `max_length`, into the slots the file
has for it), counted with the start token.
"""

from __future__ import annotations

import tempfile

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


def prompt_tokens(tokenizer, text: str, has_start: bool) -> int:
    """The tokens of prompt `text` with the start token, where the bundle has one."""
    return int(has_start) + len(tokenizer(text))


def _prompt_of(tokenizer, words: list[str], tokens: int, has_start: bool) -> str:
    """A prompt of about `tokens` tokens with the start token (at most that many): whole
    words while three more fit, then one letter at a time."""

    def count(text: str) -> int:
        return prompt_tokens(tokenizer, text, has_start)

    text, i = words[0], 1
    while count(f"{text} {words[i % len(words)]}") <= tokens and i < 4 * tokens:
        text, i = f"{text} {words[i % len(words)]}", i + 1
    while count(text + words[0][0]) <= tokens and len(text) < 8 * tokens:
        text += words[0][0]
    return text


def check_prompts(
    tokenizer, prefill_lengths: tuple[int, ...], max_length: int, has_start: bool
) -> list[str]:
    """The prompts of the module docstring: shorter than the smallest `prefill_<n>` (when
    it is over 2), longer than the largest, and the longest the engine takes
    (`max_length - 2` tokens: its last chunk's padding runs past `max_length`), those the
    cache holds with a token generated."""
    words, prompts = _words(tokenizer), []
    if prefill_lengths[0] > 2:
        prompts.append(words[0])
    for tokens in (prefill_lengths[-1] + 2, max_length - 2):
        prompt = _prompt_of(tokenizer, words, tokens, has_start)
        if (
            prompt_tokens(tokenizer, prompt, has_start) > prefill_lengths[-1]
            and prompt not in prompts
        ):
            prompts.append(prompt)
    return prompts


def keras_hub_text(causal_lm, max_length: int):
    """`prompt -> text`: keras_hub's greedy `generate()` after the prompt."""
    causal_lm.compile(sampler="greedy")
    return lambda prompt: str(causal_lm.generate(prompt, max_length=max_length, strip_prompt=True))


def step_model_text(step_model, tokenizer, start: int | None, stops, max_length: int):
    """`prompt -> text` for a `decoder_models` step model, as keras_hub's `generate()`
    makes it: the prompt's ids after the start token (where there is one), Keras's greedy
    tokens (`keras_greedy`) until a stop token or `max_length` tokens in all, then the
    tokenizer's text of those tokens with its special tokens left out."""
    import numpy as np

    from keras_posenc.export.decoder.greedy_generation import keras_greedy

    special = set(int(i) for i in getattr(tokenizer, "special_token_ids", []))

    def text(prompt: str) -> str:
        ids = [] if start is None else [start]
        ids += [int(i) for i in np.asarray(tokenizer(prompt))]
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
    has_start = plan.start_token is not None
    prompts = check_prompts(tokenizer, plan.prefill_lengths, max_length, has_start)
    cases = []
    # The engine writes its XNNPACK weight cache beside the model unless told where.
    with (
        tempfile.TemporaryDirectory(prefix="keras_posenc_litertlm_cache_") as cache,
        litert_lm.Engine(str(path), max_num_tokens=max_length, cache_dir=cache) as engine,
    ):
        for prompt in prompts:
            expected = reference(prompt)
            with engine.create_session(
                apply_prompt_template=False, sampler_config=litert_lm.SamplerConfig(top_k=1)
            ) as session:
                session.run_prefill([prompt])
                got = session.run_decode().texts[0]
            cases.append(
                {
                    "prompt": prompt,
                    "prompt_tokens": prompt_tokens(tokenizer, prompt, has_start),
                    "keras_hub": expected,
                    "litert_lm": got,
                    "equal": got == expected,
                }
            )
    return {"cases": cases, "passed": bool(cases) and all(c["equal"] for c in cases)}


def litertlm_failure(report: dict) -> str | None:
    """None when the engine's text equals keras_hub's for every prompt (or no bundle was
    checked); otherwise the first prompt where it differs."""
    result = report.get("litertlm")
    if result is None or result["passed"]:
        return None
    if not result["cases"]:
        return "The LiteRT-LM bundle was not checked: max_length leaves no room for a prompt."
    case = next(c for c in result["cases"] if not c["equal"])
    return (
        f"LiteRT-LM's engine does not generate Keras's text for the prompt of "
        f"{case['prompt_tokens']} tokens: {case['litert_lm']!r} instead of {case['keras_hub']!r}."
    )
