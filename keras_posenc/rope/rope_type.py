"""One RoPE registry entry (`RopeType`) and what its function computes (`RopeParameters`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np


@dataclasses.dataclass(frozen=True)
class RopeParameters:
    """What a scaling dict means for a rotation of `rotary_dim` channels.

    Attributes:
        inverse_frequencies: float64 `ω`, used while the total length is at most
            `switch_length` (always, when that is None).
        attention_factor: multiplies cos and sin.
        switch_length: past this total length (`start_index` + sequence, or the largest
            position + 1) `long_inverse_frequencies` or the dynamic frequencies apply.
        long_inverse_frequencies: longrope's long-context `ω`.
        dynamic_factor: dynamic NTK's factor.
    """

    inverse_frequencies: np.ndarray
    attention_factor: float = 1.0
    switch_length: int | None = None
    long_inverse_frequencies: np.ndarray | None = None
    dynamic_factor: float | None = None


@dataclasses.dataclass(frozen=True)
class RopeType:
    """One `rope_type`: the keys of its scaling dict, what it reads from a transformers
    config, and the function of its frequencies.

    The keys' values are checked by key (`keras_posenc.rope.keys`: the same key means the
    same thing in every type); `compute` checks what depends on several keys or on the
    rotation.

    Attributes:
        compute: `compute(omega, rotary_dim, max_wavelength, scaling)`: the
            `RopeParameters` of a rotation of `rotary_dim` channels whose plain float64
            frequencies are `omega`, from the checked `scaling` dict (None for `default`
            without one). Raises ValueError for what the keys' checks let through
            (llama3's `high_freq_factor <= low_freq_factor`, a longrope list of the wrong
            length).
        required: the keys the dict must hold (`rope_type`, and the `rope_theta` /
            `partial_rotary_factor` any type may carry, aside).
        optional: the keys it may hold.
        null_keys: keys given as None, which means "not given" (transformers reads them
            with `or default` / `if x is None`).
        needs_original_length: transformers' `standardize_rope_params` gives it an
            `original_max_position_embeddings` from the config (the top-level one, or
            else the config's `max_position_embeddings`).
        needs_max_length: it reads the config's `max_position_embeddings`.
        factor_from_lengths: without a `factor` it reads the config's
            `max_position_embeddings` (its factor is then the ratio of the two lengths).
        partial_in_scaling: `partial_rotary_factor` stays in the scaling dict: its fraction
            of the frequencies of a rotation of the whole head (Gemma 4's p-RoPE), not of
            the rotated channels.
    """

    compute: Callable[[np.ndarray, int, float, dict | None], RopeParameters]
    required: tuple[str, ...] = ()
    optional: tuple[str, ...] = ()
    null_keys: tuple[str, ...] = ()
    needs_original_length: bool = False
    needs_max_length: bool = False
    factor_from_lengths: bool = False
    partial_in_scaling: bool = False

    def __post_init__(self):
        # An entry's author learns of a null key it does not accept when the module loads.
        stray = sorted(set(self.null_keys) - set(self.required) - set(self.optional))
        if stray:
            raise ValueError(f"RopeType null_keys {stray} are neither required nor optional.")
