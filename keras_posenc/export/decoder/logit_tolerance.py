"""The tolerance a logit row is held to, and which rows of a greedy run are compared.

What `check.py` (the verification) and `judge.py` (its rules for ties and for the
reference's own error) share: a row's tolerance `ATOL + RTOL·rms(row)` (atol 1e-5, rtol
1e-4: optimum's and transformers' ONNX validation, with the relative part taken of the
row's RMS), a tie's width `TIE` tolerances, each logit row's position in the greedy layout
(`greedy_generation.keras_greedy`'s), and the rows compared.
"""

from __future__ import annotations

import numpy as np

ATOL, RTOL = 1e-5, 1e-4
# Logits compared at a time: their float64 errors are ~6 copies of them (a prompt of 256
# rows of a vocabulary of 128256 would be 1.6 GB at once).
BLOCK_LOGITS = 2**20
TIE = 2  # a tie: a margin a flip can cross, each of the two logits moving by a tolerance


def row_scale(logits: np.ndarray) -> np.ndarray:
    """The RMS of each row of logits (last axis), what `RTOL` is relative to.

    A logit's float32 error comes from its row's hidden state and the head, not from its
    own size: one near 0 carries the error of the row's large ones (a Gemma 4 prompt of
    120 tokens: keras_hub's logits 3.4e-5 from a float64 decode where |logit| is 1e-3).
    """
    return np.sqrt(np.mean(np.square(logits), axis=-1, keepdims=True))


def bound(logits: np.ndarray) -> np.ndarray:
    """Each row's tolerance `ATOL + RTOL·rms(row)`, `(..., 1)`."""
    return ATOL + RTOL * row_scale(np.asarray(logits, np.float64))


def margin(logits: np.ndarray) -> np.ndarray:
    """Each row's top-1 logit less its top-2 (last axis)."""
    top = np.partition(np.asarray(logits, np.float64), -2, axis=-1)
    return top[..., -1] - top[..., -2]


def positions(mask: np.ndarray, steps: int) -> list[np.ndarray]:
    """Each logit row's position in the greedy layout: `(batch, prompt)` for the prompt
    (negative at padding), then `(batch,)` per step (step `s` follows token `s - 1`)."""
    real = mask.astype(bool).sum(axis=1)
    prompt = np.arange(mask.shape[1])[None, :] - (mask.shape[1] - real)[:, None]
    return [prompt, *(real - 1 + s for s in range(1, steps + 1))]


def compared(mask: np.ndarray, steps: int, released=None) -> list[np.ndarray]:
    """Boolean selections of the logit rows compared (greedy layout): the prompt's real
    tokens and every step, short of each row's `released` position (a router tie: see
    `judge.py`) on."""
    released = np.full(len(mask), np.inf) if released is None else np.asarray(released)
    at = positions(mask, steps)
    first = mask.astype(bool) & (at[0] < released[:, None])
    return [first, *(p < released for p in at[1:])]
