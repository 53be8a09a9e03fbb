"""What a RoPE `scaling` dict may hold: its keys per `rope_type`, each value's type and range.

`checked_scaling` turns a user's dict (transformers' `rope_scaling` or `rope_parameters`)
into plain Python values or raises an error naming the key; the keys of each type are its
entry's in `keras_posenc.rope.registry`, and a type that is not there is refused by name.
`keras_posenc.rope.scaling` computes the frequencies from the checked dict.
"""

from __future__ import annotations

import math

import numpy as np

from keras_posenc._checks import short_repr
from keras_posenc.rope.registry import ROPE_TYPES

_NUMBER = (int, float, np.integer, np.floating)

# Keys a scaling dict may carry whatever its rope_type: transformers 5's `rope_parameters`
# keeps the base and the rotated fraction there.
SHARED_KEYS = ("rope_theta", "partial_rotary_factor")
_INTEGER_KEYS = ("original_max_position_embeddings", "max_position_embeddings")
_LIST_KEYS = ("short_factor", "long_factor")


def _is_number(value) -> bool:
    return isinstance(value, _NUMBER) and not isinstance(value, (bool, np.bool_))


def _checked_value(key: str, value, rope_type: str):
    """The value of `key` as a plain Python number / list / bool, or a clear error."""
    where = f"scaling[{key!r}] for rope_type {rope_type!r}"
    if value is None and key in ROPE_TYPES[rope_type].null_keys:
        return None  # "not given"
    if key == "truncate":
        if not isinstance(value, (bool, np.bool_)):
            raise ValueError(f"{where} must be true or false, got {short_repr(value)}.")
        return bool(value)
    if key in _LIST_KEYS:
        items = None
        if isinstance(value, np.ndarray) and value.ndim == 1:
            items = value.tolist()
        elif isinstance(value, (list, tuple)):
            items = list(value)
        if items is None or not all(_is_number(v) and math.isfinite(v) and v > 0 for v in items):
            raise ValueError(
                f"{where} must be a list of finite positive numbers, got {short_repr(value)}."
            )
        # Plain floats: the dict goes into get_config and .keras files as JSON.
        return [float(v) for v in items]
    if not _is_number(value) or not math.isfinite(value):
        raise ValueError(f"{where} must be a finite number, got {short_repr(value)}.")
    if key in _INTEGER_KEYS:
        if value != int(value) or value <= 0:
            raise ValueError(f"{where} must be a positive integer, got {short_repr(value)}.")
        return int(value)
    if key == "partial_rotary_factor" and not 0 < value <= 1:
        raise ValueError(f"{where} must be in (0, 1], got {short_repr(value)}.")
    if value <= 0:
        raise ValueError(f"{where} must be > 0, got {short_repr(value)}.")
    return float(value)


def checked_scaling(scaling: dict | None) -> dict | None:
    """`scaling` with its keys and values checked; None for no scaling.

    The result has plain Python values (lists for longrope factors, also when given numpy
    arrays) and `rope_type` (a legacy `type` is renamed; both may be given when they agree,
    as in transformers 5's `to_dict()`). `rope_theta` / `partial_rotary_factor` (transformers
    5 keeps them here) stay, for `rope_parameters` to check against the layer.
    """
    if scaling is None:
        return None
    if not isinstance(scaling, dict):
        raise TypeError(f"scaling must be a dict with a 'rope_type', got {short_repr(scaling)}.")
    scaling = dict(scaling)
    if "type" in scaling:
        legacy = scaling.pop("type")
        if scaling.setdefault("rope_type", legacy) != legacy:
            raise ValueError(
                f"scaling has 'type' {short_repr(legacy)} and 'rope_type' "
                f"{short_repr(scaling['rope_type'])}; they must agree (or give one)."
            )
    rope_type = scaling.get("rope_type")
    if not isinstance(rope_type, str) or rope_type not in ROPE_TYPES:
        raise ValueError(
            f"Unknown rope_type {short_repr(rope_type)} in scaling; expected one of "
            f"{tuple(ROPE_TYPES)}."
        )
    entry = ROPE_TYPES[rope_type]
    required, optional = entry.required, entry.optional
    missing = [key for key in required if key not in scaling]
    if missing:
        raise ValueError(
            f"scaling for rope_type {rope_type!r} is missing {missing}; it needs {list(required)} "
            f"and accepts {list(optional)}."
        )
    unknown = sorted(set(scaling) - set(required) - set(optional) - {"rope_type", *SHARED_KEYS})
    if unknown:
        raise ValueError(
            f"scaling for rope_type {rope_type!r} has unknown keys {unknown}; it needs "
            f"{list(required)} and accepts {list(optional)}."
        )
    return {
        key: value if key == "rope_type" else _checked_value(key, value, rope_type)
        for key, value in scaling.items()
    }


def check_shared_keys(scaling: dict, max_wavelength: float) -> None:
    """transformers 5's `rope_theta` / `partial_rotary_factor` in a scaling dict, checked.

    They must agree with the layer: `rope_theta` equal to `max_wavelength` (a dict taken
    from a config with another base would rotate at the wrong frequencies), and
    `partial_rotary_factor` 1 (the layer cannot see the head size to apply a fraction:
    give `rotary_dim`, or use `from_transformers_config`, which does), except for a type
    whose fraction is of the frequencies of a rotation of the whole head (its entry's
    `partial_in_scaling`: `proportional`). `scaling` is a checked dict.
    """
    theta = scaling.get("rope_theta")
    fraction_of_pairs = ROPE_TYPES[scaling["rope_type"]].partial_in_scaling
    if theta is not None and theta != float(max_wavelength):
        raise ValueError(
            f"scaling['rope_theta']={theta} differs from max_wavelength={max_wavelength}: pass "
            f"max_wavelength={theta} (or drop 'rope_theta' from scaling)."
        )
    partial = scaling.get("partial_rotary_factor", 1.0)
    if partial != 1.0 and not fraction_of_pairs:  # the type's own key then
        raise ValueError(
            f"scaling['partial_rotary_factor']={partial}: the layer cannot apply a fraction of "
            "the head; pass rotary_dim=int(head_dim * factor) and drop the key, or build the "
            "layer with from_transformers_config."
        )
