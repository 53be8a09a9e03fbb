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


def prompt_tokens(tokenizer, text: str) -> int:
    """The tokens of prompt `text` with the start token, where the tokenizer has one."""
    start = getattr(tokenizer, "start_token_id", None) is not None
    return int(start) + len(tokenizer(text))


def _prompt_of(tokenizer, words: list[str], tokens: int) -> str:
    """A prompt of about `tokens` tokens with the start token (at most that many): whole
    words while three more fit, then one letter at a time."""

    def count(text: str) -> int:
        return prompt_tokens(tokenizer, text)

    text, i = words[0], 1
    while count(f"{text} {words[i % len(words)]}") <= tokens and i < 4 * tokens:
        text, i = f"{text} {words[i % len(words)]}", i + 1
    while count(text + words[0][0]) <= tokens and len(text) < 8 * tokens:
        text += words[0][0]
    return text


def check_prompts(tokenizer, prefill_lengths: tuple[int, ...], max_length: int) -> list[str]:
    """The prompts of the module docstring: shorter than the smallest `prefill_<n>` (when
    it is over 2), longer than the largest, and the longest the engine takes
    (`max_length - 2` tokens: its last chunk's padding runs past `max_length`), those the
    cache holds with a token generated."""
    words, prompts = _words(tokenizer), []
    if prefill_lengths[0] > 2:
        prompts.append(words[0])
    for tokens in (prefill_lengths[-1] + 2, max_length - 2):
        prompt = _prompt_of(tokenizer, words, tokens)
        if prompt_tokens(tokenizer, prompt) > prefill_lengths[-1] and prompt not in prompts:
            prompts.append(prompt)
    return prompts


def check_litertlm(path, causal_lm, prefill_lengths: tuple[int, ...], max_length: int) -> dict:
    """`{"cases": [...], "passed": bool}`: each prompt's text from keras_hub and the engine.

    Raises:
        RuntimeError: the engine refused the bundle (its message is in the log above).
    """
    import litert_lm

    litert_lm.set_min_log_severity(litert_lm.LogSeverity.ERROR)
    causal_lm.compile(sampler="greedy")
    prompts = check_prompts(causal_lm.preprocessor.tokenizer, prefill_lengths, max_length)
    cases = []
    # The engine writes its XNNPACK weight cache beside the model unless told where.
    with (
        tempfile.TemporaryDirectory(prefix="keras_posenc_litertlm_cache_") as cache,
        litert_lm.Engine(str(path), max_num_tokens=max_length, cache_dir=cache) as engine,
    ):
        for prompt in prompts:
            expected = causal_lm.generate(prompt, max_length=max_length, strip_prompt=True)
            with engine.create_session(
                apply_prompt_template=False, sampler_config=litert_lm.SamplerConfig(top_k=1)
            ) as session:
                session.run_prefill([prompt])
                got = session.run_decode().texts[0]
            cases.append(
                {
                    "prompt": prompt,
                    "prompt_tokens": prompt_tokens(causal_lm.preprocessor.tokenizer, prompt),
                    "keras_hub": str(expected),
                    "litert_lm": got,
                    "equal": got == str(expected),
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
        f"LiteRT-LM's engine does not generate keras_hub's text for the prompt of "
        f"{case['prompt_tokens']} tokens: {case['litert_lm']!r} instead of {case['keras_hub']!r}."
    )
