"""The RoPE registry: one `RopeType` per `rope_type` of transformers, in `ROPE_TYPES`.

Each entry holds the keys of its scaling dict, what it reads from a transformers config,
and the function of its frequencies (transformers keeps these functions in
`ROPE_INIT_FUNCTIONS`, `modeling_rope_utils.py`); the checks (`keras_posenc.rope.keys`),
`rope_parameters` and the config readers take everything from the entry, and a type that is
not here is refused by name. A new type is one entry here. The numbers are transformers'
definitions, computed in float64 on the host:

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
- `axial`: transformers' vision RoPE (`keras_posenc.configs.axial`): no keys of its
  own, and no frequencies of one axis (the error says to give `axes_dims`).

A type whose frequencies change with the total length sets `RopeParameters.switch_length`
and needs rows that switch (`keras_posenc.rope.scaling`, `keras_posenc.rotary_tables`).
"""

from __future__ import annotations

import math

import numpy as np

from keras_posenc._checks import short_repr
from keras_posenc.rope.rope_type import RopeParameters, RopeType


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


def _default(omega: np.ndarray, dim: int, base: float, scaling: dict | None) -> RopeParameters:
    return RopeParameters(omega)


def _linear(omega: np.ndarray, dim: int, base: float, scaling: dict) -> RopeParameters:
    return RopeParameters(omega / _number(scaling, "factor", "linear"))


def _dynamic(omega: np.ndarray, dim: int, base: float, scaling: dict) -> RopeParameters:
    if dim < 4:
        raise ValueError(
            f"dynamic scaling needs rotary_dim >= 4 (its exponent is d/(d-2)), got {dim}."
        )
    return RopeParameters(
        omega,
        switch_length=int(_number(scaling, "max_position_embeddings", "dynamic")),
        dynamic_factor=_number(scaling, "factor", "dynamic"),
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


def _proportional(omega: np.ndarray, dim: int, base: float, scaling: dict) -> RopeParameters:
    # transformers: rope_angles = int(partial_rotary_factor * head_dim // 2).
    rotated = int(scaling.get("partial_rotary_factor", 1.0) * dim // 2)
    factor = scaling.get("factor")
    omega = np.where(np.arange(dim // 2) < rotated, omega, 0.0)
    return RopeParameters(omega / (1.0 if factor is None else float(factor)))


def _llama3(omega: np.ndarray, dim: int, base: float, scaling: dict) -> RopeParameters:
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


def _longrope(omega: np.ndarray, dim: int, base: float, scaling: dict) -> RopeParameters:
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


def _axial(omega: np.ndarray, dim: int, base: float, scaling: dict) -> RopeParameters:
    raise ValueError(
        "rope_type 'axial' (transformers' 2D vision RoPE) turns pairs by two coordinates, "
        "not one scaling of one axis: use RotaryEmbedding(axes_dims=(d/2, d/2)) with "
        "positions (tokens, 2), which RotaryEmbedding.from_transformers_config reads."
    )


# The registry. The order is that of the messages naming the types.
ROPE_TYPES: dict[str, RopeType] = {
    "default": RopeType(_default),
    "linear": RopeType(_linear, required=("factor",)),
    "dynamic": RopeType(
        _dynamic,
        required=("factor", "max_position_embeddings"),
        # Accepted and unused, as in transformers.
        optional=("original_max_position_embeddings",),
        needs_max_length=True,
    ),
    "yarn": RopeType(
        _yarn,
        optional=(
            "factor",
            "original_max_position_embeddings",
            "max_position_embeddings",
            "attention_factor",
            "beta_fast",
            "beta_slow",
            "mscale",
            "mscale_all_dim",
            "truncate",
        ),
        null_keys=(
            "factor",
            "attention_factor",
            "beta_fast",
            "beta_slow",
            "mscale",
            "mscale_all_dim",
        ),
        needs_original_length=True,
        factor_from_lengths=True,
    ),
    "llama3": RopeType(
        _llama3,
        required=(
            "factor",
            "low_freq_factor",
            "high_freq_factor",
            "original_max_position_embeddings",
        ),
        optional=("max_position_embeddings",),
        needs_original_length=True,
    ),
    # Gemma 4's p-RoPE: the exponent's denominator is the whole head, and the frequencies of
    # all but the first `partial_rotary_factor` of the channel pairs are zero.
    "proportional": RopeType(_proportional, optional=("factor",), partial_in_scaling=True),
    "axial": RopeType(_axial),
    "longrope": RopeType(
        _longrope,
        required=("short_factor", "long_factor"),
        optional=(
            "factor",
            "attention_factor",
            "original_max_position_embeddings",
            "max_position_embeddings",
        ),
        null_keys=("factor", "attention_factor"),
        needs_original_length=True,
        factor_from_lengths=True,
    ),
}


def find_rope_type(name) -> RopeType | None:
    """The entry of `name`; None when no type has that name (`checked_scaling` refuses it,
    naming the known ones), for readers that run before that check."""
    return ROPE_TYPES.get(name) if isinstance(name, str) else None
