"""RoPE scaling: the inverse frequencies and attention factor of each `rope_type` of transformers.

A `scaling` dict has the shape of the transformers library's `rope_scaling` /
`rope_parameters` (`modeling_rope_utils.py`): a `rope_type` and that type's keys. The
numbers here are those definitions, computed in float64 on the host:

- `linear`: `ω / factor`.
- `dynamic` (NTK): past `max_position_embeddings` = M, with total length L the base becomes
  `base · (factor·L/M - (factor - 1))^(d/(d-2))`. L is only known at run time, so these
  frequencies are made for it as two float32 words (`keras_posenc.dynamic_ntk`).
- `yarn`: a ramp between interpolated (`ω / factor`) and extrapolated (`ω`) frequencies
  set by `beta_fast` / `beta_slow` (optionally `truncate`d), and an attention factor from
  `mscale` / `mscale_all_dim` (or given).
- `llama3`: low frequencies divided by `factor`, high ones kept, a smooth blend between,
  set by `low_freq_factor`, `high_freq_factor`, `original_max_position_embeddings`.
- `proportional` (Gemma 4's p-RoPE): `ω_k = base^(-2k/d) / factor` for the first
  `int(partial_rotary_factor · d // 2)` pairs of the `d` rotated channels and 0 for the rest
  (those pairs pass through unrotated, in the place the pairing gives them: not partial
  rotary, which shortens `d`).
- `longrope`: `ω / short_factor` up to `original_max_position_embeddings`, `ω / long_factor`
  past it (by total length), attention factor `sqrt(1 + ln f / ln L0)`.

The attention factor multiplies cos and sin.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
from keras import ops

from keras_posenc._lazy import tricks
from keras_posenc.frequencies import as_rows, inverse_frequencies
from keras_posenc.scaling_keys import (  # noqa: F401  ROPE_TYPES, checked_scaling: re-exported
    ROPE_TYPES,
    check_shared_keys,
    checked_scaling,
    short_repr,
)


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


def _number(scaling: dict, key: str, rope_type: str) -> float:
    # checked_scaling made the value a finite positive float.
    return float(scaling[key])


def _factors(scaling: dict, key: str, rotary_dim: int) -> np.ndarray:
    values = scaling[key]
    if len(values) != rotary_dim // 2:
        raise ValueError(
            f"scaling[{key!r}] for longrope must be a list of {rotary_dim // 2} positive numbers "
            f"(one per channel pair of rotary_dim={rotary_dim}), got {len(values)}: "
            f"{short_repr(values)}."
        )
    return np.asarray(values, dtype=np.float64)


def _original_length(scaling: dict, rope_type: str) -> int:
    for key in ("original_max_position_embeddings", "max_position_embeddings"):
        if key in scaling:
            return int(_number(scaling, key, rope_type))
    raise ValueError(
        f"scaling for rope_type {rope_type!r} needs 'original_max_position_embeddings' "
        "(or 'max_position_embeddings')."
    )


def _factor_or_ratio(scaling: dict, rope_type: str) -> float:
    """`factor`, or else `max_position_embeddings / original_max_position_embeddings`."""
    if scaling.get("factor") is not None:
        return _number(scaling, "factor", rope_type)
    if "max_position_embeddings" in scaling and "original_max_position_embeddings" in scaling:
        return _number(scaling, "max_position_embeddings", rope_type) / _number(
            scaling, "original_max_position_embeddings", rope_type
        )
    raise ValueError(
        f"scaling for rope_type {rope_type!r} needs 'factor' (or both 'max_position_embeddings' "
        "and 'original_max_position_embeddings')."
    )


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def rope_parameters(rotary_dim: int, max_wavelength: float, scaling: dict | None) -> RopeParameters:
    """The inverse frequencies and attention factor that `scaling` defines."""
    omega = inverse_frequencies(rotary_dim, max_wavelength)
    scaling = checked_scaling(scaling)
    if scaling is not None:
        check_shared_keys(scaling, max_wavelength)
    rope_type = "default" if scaling is None else scaling["rope_type"]
    if rope_type == "default":
        return RopeParameters(omega)
    if rope_type == "linear":
        return RopeParameters(omega / _number(scaling, "factor", rope_type))
    if rope_type == "dynamic":
        if rotary_dim < 4:
            raise ValueError(
                "dynamic scaling needs rotary_dim >= 4 (its exponent is d/(d-2)), "
                f"got {rotary_dim}" + "."
            )
        return RopeParameters(
            omega,
            switch_length=int(_number(scaling, "max_position_embeddings", rope_type)),
            dynamic_factor=_number(scaling, "factor", rope_type),
        )
    if rope_type == "yarn":
        return _yarn(omega, rotary_dim, max_wavelength, scaling)
    if rope_type == "llama3":
        return _llama3(omega, scaling)
    if rope_type == "proportional":
        return _proportional(omega, rotary_dim, scaling)
    if rope_type == "longrope":
        return _longrope(omega, rotary_dim, scaling)
    if rope_type == "axial":
        raise ValueError(
            "rope_type 'axial' (transformers' 2D vision RoPE) turns pairs by two coordinates, "
            "not one scaling of one axis: use RotaryEmbedding(axes_dims=(d/2, d/2)) with "
            "positions (tokens, 2), which RotaryEmbedding.from_transformers_config reads."
        )
    raise ValueError(
        f"rope_type {rope_type!r} has no frequencies here; expected one of {tuple(ROPE_TYPES)}."
    )


def _yarn(omega: np.ndarray, dim: int, base: float, scaling: dict) -> RopeParameters:
    factor = _factor_or_ratio(scaling, "yarn")
    original = _original_length(scaling, "yarn")
    attention_factor = scaling.get("attention_factor")
    if attention_factor is None:
        mscale, mscale_all_dim = scaling.get("mscale"), scaling.get("mscale_all_dim")
        if mscale and mscale_all_dim:
            attention_factor = _yarn_mscale(factor, mscale) / _yarn_mscale(factor, mscale_all_dim)
        else:
            attention_factor = _yarn_mscale(factor)
    beta_fast = scaling.get("beta_fast") or 32
    beta_slow = scaling.get("beta_slow") or 1

    def correction_dim(rotations: float) -> float:
        # The channel index whose wavelength makes `rotations` turns over `original` positions.
        return dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if scaling.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # as transformers: avoids dividing by zero
    ramp = np.clip((np.arange(dim // 2, dtype=np.float64) - low) / (high - low), 0.0, 1.0)
    extrapolation = 1.0 - ramp
    blended = (omega / factor) * (1.0 - extrapolation) + omega * extrapolation
    return RopeParameters(blended, attention_factor=float(attention_factor))


def _proportional(omega: np.ndarray, dim: int, scaling: dict) -> RopeParameters:
    # transformers: rope_angles = int(partial_rotary_factor * head_dim // 2).
    rotated = int(scaling.get("partial_rotary_factor", 1.0) * dim // 2)
    factor = scaling.get("factor")
    omega = np.where(np.arange(dim // 2) < rotated, omega, 0.0)
    return RopeParameters(omega / (1.0 if factor is None else float(factor)))


def _llama3(omega: np.ndarray, scaling: dict) -> RopeParameters:
    factor = _number(scaling, "factor", "llama3")
    low_freq_factor = _number(scaling, "low_freq_factor", "llama3")
    high_freq_factor = _number(scaling, "high_freq_factor", "llama3")
    original = _number(scaling, "original_max_position_embeddings", "llama3")
    if high_freq_factor <= low_freq_factor:
        raise ValueError(
            "llama3 scaling needs high_freq_factor > low_freq_factor, got "
            f"{high_freq_factor} and {low_freq_factor}."
        )
    wavelength = 2 * math.pi / omega
    low_freq_wavelength = original / low_freq_factor
    high_freq_wavelength = original / high_freq_factor
    scaled = np.where(wavelength > low_freq_wavelength, omega / factor, omega)
    smooth = (original / wavelength - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelength >= high_freq_wavelength) & (wavelength <= low_freq_wavelength)
    return RopeParameters(np.where(medium, smoothed, scaled))


def _longrope(omega: np.ndarray, dim: int, scaling: dict) -> RopeParameters:
    original = _original_length(scaling, "longrope")
    if scaling.get("factor") is not None:
        factor = _number(scaling, "factor", "longrope")
    elif "max_position_embeddings" in scaling:
        factor = _number(scaling, "max_position_embeddings", "longrope") / original
    else:
        factor = 1.0
    attention_factor = scaling.get("attention_factor")
    if attention_factor is None:
        attention_factor = (
            1.0 if factor <= 1 else math.sqrt(1 + math.log(factor) / math.log(original))
        )
    return RopeParameters(
        omega / _factors(scaling, "short_factor", dim),
        attention_factor=float(attention_factor),
        switch_length=original,
        long_inverse_frequencies=omega / _factors(scaling, "long_factor", dim),
    )


class SwitchByLength:
    """Rows of `short` while the total length is at most `switch_length`, of `long` past it.

    The total length is `start_index + sequence` for a run and the largest position + 1
    for explicit positions; it is decided at trace time when known, else at run time
    (`keras.ops.cond`).
    """

    def __init__(self, short, long, switch_length: int):
        self.short = short
        self.long = long
        self.switch_length = switch_length

    def slice(self, start, length, combine=as_rows, traced=None):
        return self._choose(
            start + length,
            lambda table, combine: table.slice(start, length, combine, traced),
            combine,
        )

    def gather(self, positions) -> tuple:
        return self._choose(
            ops.max(positions) + 1,
            lambda table, combine: combine(*table.gather(positions)),
            as_rows,
        )

    def _choose(self, total_length, rows, combine):
        """`combine` of `rows(table, combine_inside)` of the table `total_length` picks: where
        `combine` runs is the backend's (`tricks().combined`)."""
        t = tricks()
        known = t.static_value(total_length)
        if known is not None:
            table = self.long if known > self.switch_length else self.short
            return t.combined(lambda inside: rows(table, inside), combine)
        return t.combined(
            lambda inside: t.cond(
                total_length > self.switch_length,
                lambda: rows(self.long, inside),
                lambda: rows(self.short, inside),
            ),
            combine,
        )


class DynamicRows:
    """Rows for dynamic NTK scaling: frequencies for the total length as two float32 words
    (`keras_posenc.dynamic_ntk`), rotated by the fixed-point `tricks().exact_sin_cos`."""

    def __init__(self, omega: np.ndarray, factor: float, max_position_embeddings: int, layout):
        from keras_posenc.dynamic_ntk import DynamicFrequencies

        self.frequencies = DynamicFrequencies(omega, factor, max_position_embeddings)
        self.layout = layout

    def slice(self, start, length, combine=as_rows, traced=None):
        positions = ops.arange(length, dtype="int32") + start
        total_length = tricks().total_length_of_run(start, length, positions)
        return combine(*self._rows(positions, total_length))

    def gather(self, positions) -> tuple:
        return self._rows(positions, ops.max(positions) + 1)

    def _rows(self, positions, total_length) -> tuple:
        turns = self.frequencies.turns(total_length)
        return tuple(self.layout(*tricks().exact_sin_cos(positions, turns)))
