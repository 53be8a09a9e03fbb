"""A `save_decoder` folder run by onnxruntime and numpy: `load(folder).generate(...)`."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from keras_posenc_serve.sampling import check_sampling, next_tokens
from keras_posenc_serve.session import SharedCacheSession


class DecoderFolder:
    """An exported decoder folder (`model.onnx` and `genai_config.json`), ready to generate.

    Attributes:
        max_length: the longest sequence, prompt included (`context_length`).
        vocabulary: the vocabulary size.
        eos_token_ids: the end tokens `genai_config.json` names (a list).
        pad_token_id: what fills a row after its end token.
        session: the `onnxruntime.InferenceSession`.
    """

    def __init__(self, folder: str | os.PathLike, providers: Sequence[str] | None = None):
        import onnxruntime

        folder = Path(folder)
        config_path = folder / "genai_config.json"
        if not config_path.is_file():
            raise FileNotFoundError(
                f"{config_path} does not exist: load() takes a folder written by "
                "keras_posenc.export.save_decoder (model.onnx and genai_config.json)."
            )
        model = json.loads(config_path.read_text())["model"]
        self.folder = folder
        self.max_length = int(model["context_length"])
        self.vocabulary = int(model["vocab_size"])
        eos = model.get("eos_token_id", [])
        self.eos_token_ids = [int(t) for t in (eos if isinstance(eos, list) else [eos])]
        self.pad_token_id = int(model.get("pad_token_id", 0))
        self.session = onnxruntime.InferenceSession(
            str(folder / model["decoder"]["filename"]),
            providers=list(providers or ["CPUExecutionProvider"]),
        )

    def generate(
        self,
        prompts,
        steps: int,
        *,
        mask: np.ndarray | None = None,
        temperature: float = 0.0,
        top_k: int | None = None,
        top_p: float = 1.0,
        seed: int | None = None,
        stop_token_ids: Sequence[int] | None = None,
        return_logits: bool = False,
    ):
        """Generates `steps` new tokens after each prompt.

        A batch is padded on the left; each row decodes as it would alone (its positions
        count its own tokens only). Greedy where `temperature` is 0, else a draw from the
        logits divided by `temperature`, cut to the `top_k` most likely and to the fewest
        whose probability reaches `top_p`; row `r` draws from its own generator, made from
        `seed` (`numpy.random.SeedSequence(seed).spawn`), so a seed gives the same tokens
        for the same prompts.

        Args:
            prompts: token ids: a list of lists (of any lengths), or an int array
                `(batch, prompt)` whose rows are padded on the left where `mask` is 0.
            steps: how many tokens to generate (>= 1).
            mask: with an array of prompts, 1 for a token and 0 for left padding.
            temperature, top_k, top_p, seed: sampling (temperature 0: greedy).
            stop_token_ids: a row ends after one of these (keras_hub's
                `stop_token_ids`); None: every row makes `steps` tokens (the folder's own
                end tokens are `eos_token_ids`, pass them to stop there).
            return_logits: also return the logits each token was chosen from.

        Returns:
            `tokens` `(batch, steps)` int64, a row that ended holding `pad_token_id`
            after its end token; with `return_logits`, `(tokens, logits)`, logits
            `(batch, steps, vocabulary)` float32 (0 after a row's end).

        Raises:
            ValueError: prompts, steps or a setting out of range, or a sequence longer
                than `max_length`.
        """
        ids, attention = self._prompts(prompts, mask)
        steps = _count("steps", steps)
        check_sampling(temperature, top_k, top_p)
        stops = self._ids("stop_token_ids", stop_token_ids or [])
        batch, width = ids.shape
        if width + steps > self.max_length:
            raise ValueError(
                f"A prompt of {width} tokens (the longest row, left-padded) and {steps} "
                f"steps make {width + steps} tokens, past this folder's max_length of "
                f"{self.max_length} (genai_config.json's context_length, the cache slots): "
                "ask for fewer steps, or export with a larger max_length."
            )
        rngs = [np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(batch)]
        cached = SharedCacheSession(self.session, batch, width + steps - 1)
        tokens = np.full((batch, steps), self.pad_token_id, np.int64)
        logits = np.zeros((batch, steps, self.vocabulary), np.float32)
        live = np.ones(batch, bool)
        for step in range(steps):
            step_logits = cached(ids, attention)[:, -1]
            chosen = next_tokens(step_logits, rngs, temperature, top_k, top_p)
            tokens[live, step] = chosen[live]
            logits[live, step] = step_logits[live]
            live &= ~np.isin(chosen, stops)
            if not live.any() or step == steps - 1:
                break
            ids = chosen[:, None]
            attention = np.concatenate([attention, np.ones((batch, 1), np.int64)], axis=1)
        return (tokens, logits) if return_logits else tokens

    def _prompts(self, prompts, mask) -> tuple[np.ndarray, np.ndarray]:
        """`(ids, attention_mask)` int64 `(batch, width)`, left-padded, ids checked."""
        if isinstance(prompts, np.ndarray):
            if prompts.ndim != 2 or not np.issubdtype(prompts.dtype, np.integer):
                raise ValueError(
                    f"prompts must be integer token ids of shape (batch, prompt) or a list "
                    f"of lists, got an array of dtype {prompts.dtype} and shape {prompts.shape}."
                )
            attention = np.ones(prompts.shape, np.int64) if mask is None else np.asarray(mask)
            if attention.shape != prompts.shape or not np.isin(attention, (0, 1)).all():
                raise ValueError(f"mask must be 0s and 1s of the prompts' shape {prompts.shape}.")
            if (np.diff(attention, axis=1) < 0).any() or not attention[:, -1].all():
                raise ValueError(
                    "mask must pad on the left: each row 0s, then 1s up to the last column."
                )
            ids = np.where(attention == 1, prompts, 0).astype(np.int64)
        else:
            if mask is not None:
                raise ValueError("mask goes with an array of prompts, not with a list of lists.")
            rows = [list(self._ids("prompts", row)) for row in prompts]
            if not rows or not all(rows):
                raise ValueError("prompts must hold at least one row, each of at least one token.")
            width = max(map(len, rows))
            ids = np.zeros((len(rows), width), np.int64)
            attention = np.zeros((len(rows), width), np.int64)
            for r, row in enumerate(rows):
                ids[r, width - len(row) :], attention[r, width - len(row) :] = row, 1
        self._ids("prompts", ids[attention == 1])
        if not ids.size:
            raise ValueError("prompts must hold at least one row, each of at least one token.")
        return ids, attention.astype(np.int64)

    def _ids(self, name: str, ids) -> np.ndarray:
        ids = np.asarray(ids)
        if ids.size and (
            not np.issubdtype(ids.dtype, np.integer)
            or ids.min() < 0
            or ids.max() >= self.vocabulary
        ):
            raise ValueError(
                f"{name} must be token ids in [0, {self.vocabulary}) (this folder's vocabulary), "
                f"got {ids.ravel()[:8].tolist()}{'...' if ids.size > 8 else ''}."
            )
        return ids.astype(np.int64)


def _count(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}.")
    return int(value)


def load(folder: str | os.PathLike, providers: Sequence[str] | None = None) -> DecoderFolder:
    """The decoder of a `save_decoder` folder, run by onnxruntime (no Keras, no TensorFlow).

    Args:
        folder: holds `model.onnx` and `genai_config.json`.
        providers: onnxruntime's execution providers (default: the CPU's).

    Returns:
        A `DecoderFolder`; its `generate(prompts, steps)` returns the new tokens.
    """
    return DecoderFolder(folder, providers)
