"""The next token from a row of logits: greedy, or a draw with temperature, top-k and top-p.

The draw follows transformers' order (temperature, then top-k, then top-p on what is
left, renormalised): top-p keeps the fewest most likely tokens whose probability adds up
to at least `top_p` (the most likely always kept), top-k the `k` most likely (ties at the
k-th kept by their order in the vocabulary, as `argsort` puts them).
"""

from __future__ import annotations

import numpy as np


def check_sampling(temperature: float, top_k: int | None, top_p: float) -> None:
    """ValueError naming the setting that is out of range."""
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float, np.number)):
        raise TypeError(f"temperature must be a number, got {temperature!r}.")
    if not temperature >= 0:  # NaN too
        raise ValueError(f"temperature must be >= 0 (0: greedy), got {temperature!r}.")
    if top_k is not None and (
        isinstance(top_k, bool) or not isinstance(top_k, (int, np.integer)) or top_k < 1
    ):
        raise ValueError(f"top_k must be None or an integer >= 1, got {top_k!r}.")
    if isinstance(top_p, bool) or not isinstance(top_p, (int, float, np.number)):
        raise TypeError(f"top_p must be a number in (0, 1], got {top_p!r}.")
    if not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {top_p!r}.")


def probabilities(logits: np.ndarray, temperature: float, top_k: int | None, top_p: float):
    """The distribution a draw is made from, over the last axis of `logits` (float64)."""
    scaled = np.asarray(logits, np.float64) / temperature
    order = np.argsort(-scaled, axis=-1, kind="stable")  # most likely first
    ranked = np.take_along_axis(scaled, order, axis=-1)
    keep = np.ones(ranked.shape, bool)
    if top_k is not None:
        keep[..., top_k:] = False
    ranked = np.where(keep, ranked, -np.inf)
    weights = np.exp(ranked - ranked[..., :1])
    weights /= weights.sum(axis=-1, keepdims=True)
    if top_p < 1:
        before = np.cumsum(weights, axis=-1) - weights  # the mass of the likelier tokens
        weights = np.where(before < top_p, weights, 0.0)
        weights /= weights.sum(axis=-1, keepdims=True)
    out = np.zeros_like(weights)
    np.put_along_axis(out, order, weights, axis=-1)
    return out


def next_tokens(
    logits: np.ndarray,
    rngs: list,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float = 1.0,
) -> np.ndarray:
    """One token per row of `logits` `(batch, vocabulary)`: the argmax where `temperature`
    is 0, else a draw from `probabilities` with the row's own `numpy.random.Generator`."""
    if temperature == 0:
        return np.argmax(logits, axis=-1)
    weights = probabilities(logits, temperature, top_k, top_p)
    cumulative = np.cumsum(weights, axis=-1)
    draws = np.array([rng.random() for rng in rngs])[:, None] * cumulative[:, -1:]
    tokens = (cumulative <= draws).sum(axis=-1)
    return np.minimum(tokens, logits.shape[-1] - 1)
