"""The folder run as onnxruntime-genai runs it: `og.Model(folder)` and `og.Generator`.

One of `save_decoder`'s verification runtimes where onnxruntime-genai is installed, so a
folder it cannot load (an end token outside the vocabulary, a config it refuses) or runs
otherwise is never kept. Each row runs alone at batch 1: onnxruntime-genai 0.18 feeds an
all-ones attention mask for a batch padded on the left, so a padded row of a batch
generates other tokens there whatever graph is exported (`keras_posenc_serve` runs a
padded batch as each row alone). The results are put in the layout of `greedy_generation.py` (the
prompt's logits `(batch, prompt, vocabulary)`, then each step's), so `check.compare_greedy`
compares them as it compares the others.

og picks each token itself (`generate_next_token`, greedy). Where it stops before the
verification's last step, the run goes on from where it stopped, so every step is still
compared: at an end token (og does not keep it in the sequence) the token is appended
and decoding continues; at a full sequence (og never feeds the token it picks last, so
the cache's last slot is reached only as part of a prompt) a new generator takes the
whole sequence as its prompt and its last logits choose the final token.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from keras_posenc.export.decoder.genai_interface import LOGITS
from keras_posenc.export.errors import ExportError


def genai_model(folder: Path):
    """`og.Model(folder)` with a generator made from it (og checks the end tokens there), or
    an ExportError saying that onnxruntime-genai refuses the folder."""
    import onnxruntime_genai as og

    try:
        model = og.Model(str(folder))
        og.Generator(model, og.GeneratorParams(model))
    except Exception as error:  # og raises RuntimeError with its own message
        raise ExportError(
            f"onnxruntime-genai cannot run the exported folder ({error}); it is not kept."
        ) from error
    return model


def _generator(model, tokens: list[int], max_length: int):
    import onnxruntime_genai as og

    params = og.GeneratorParams(model)
    params.set_search_options(do_sample=False, max_length=max_length)
    generator = og.Generator(model, params)
    generator.append_tokens(np.asarray([tokens], np.int32))
    return generator


def _row(model, prompt: list[int], steps: int, context: int):
    """`(tokens (steps + 1,), prompt logits (prompt, vocabulary), [step logits (vocabulary,)])`:
    the prompt alone at batch 1, og picking each token."""
    max_length = min(len(prompt) + steps + 1, context)
    generator = _generator(model, prompt, max_length)
    prompt_logits = generator.get_output(LOGITS)[0]
    sequence, tokens, step_logits = list(prompt), [], []
    for step in range(steps + 1):
        if step and generator.is_done():
            if len(generator.get_sequence(0)) < len(sequence):  # stopped at an end token
                generator.append_tokens(np.asarray([[sequence[-1]]], np.int32))
            else:  # the sequence is full: its last token fed as part of a prompt
                generator = _generator(model, sequence, len(sequence))
            if len(sequence) == max_length:  # og picks no token past its max_length
                step_logits.append(generator.get_output(LOGITS)[0, -1])
                tokens.append(int(np.argmax(step_logits[-1])))
                sequence.append(tokens[-1])
                continue
        if not step and len(sequence) >= max_length:  # a prompt that fills the cache
            tokens.append(int(np.argmax(prompt_logits[-1])))  # (og picks none there)
            sequence.append(tokens[-1])
            continue
        generator.generate_next_token()
        if step:
            step_logits.append(generator.get_output(LOGITS)[0, -1])
        tokens.append(int(generator.get_next_tokens()[0]))
        sequence.append(tokens[-1])
    return np.asarray(tokens), prompt_logits, step_logits


def genai_greedy(model, context: int):
    """`greedy(prompts, mask, steps) -> (tokens, logits)` through onnxruntime-genai's
    `model` (`og.Model`), each row alone (see the module docstring); `context` the folder's
    `max_length`."""

    def greedy(prompts: np.ndarray, mask: np.ndarray, steps: int):
        batch, width = prompts.shape
        tokens = np.zeros((batch, steps + 1), np.int64)
        prompt_logits, step_logits = None, None
        for row in range(batch):
            real = [int(t) for t, m in zip(prompts[row], mask[row], strict=True) if m]
            row_tokens, row_prompt, row_steps = _row(model, real, steps, context)
            if prompt_logits is None:
                vocabulary = row_prompt.shape[-1]
                prompt_logits = np.zeros((batch, width, vocabulary), np.float32)
                step_logits = np.zeros((steps, batch, vocabulary), np.float32)
            tokens[row] = row_tokens
            prompt_logits[row, width - len(real) :] = row_prompt
            if steps:
                step_logits[:, row] = np.asarray(row_steps).reshape(steps, -1)
        return tokens, [prompt_logits, *step_logits]

    return greedy
