"""Argument checks shared by the layers: each returns the clean value or raises a clear error.

Constructor arguments are checked for their type as well as their value: `"False"` is not a
bool and `1.9` is not an axis, so neither is coerced into a plausible setting. Values that
may only be known while a graph runs (positions, start indices) go through the backend's
`tricks().check` (`keras_posenc.positions`), which raises now when it can.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence

import keras
import numpy as np

_INTEGER = (int, np.integer)


def short_repr(value, limit: int = 60) -> str:
    """`repr(value)`, cut to `limit` characters: messages never print a huge list."""
    text = repr(value)
    if len(text) <= limit:
        return text
    size = f" ({len(value)} entries)" if hasattr(value, "__len__") else ""
    return text[: limit - 3] + "..." + size


def is_int(value) -> bool:
    """Whether `value` is a Python or numpy integer (bools are not)."""
    return isinstance(value, _INTEGER) and not isinstance(value, (bool, np.bool_))


def checked_int(
    value, name: str, minimum: int | None = None, maximum: int | None = None, hint: str = ""
) -> int:
    """`value` as an int within `[minimum, maximum]` (each bound when given).

    Integers of any kind are taken (Python's, numpy's, 0-d integer arrays: anything with
    `__index__`); bools, strings and floats are not, whatever their value.

    Raises:
        TypeError: `value` is not an integer.
        ValueError: it is outside the range; the message names the range and `hint`.
    """
    allowed = _range(minimum, maximum)
    index = None
    if not isinstance(value, (bool, np.bool_, str, bytes, float, np.floating)):
        try:
            index = operator.index(value)
        except TypeError:
            pass
    if index is None:
        raise TypeError(
            f"{name} must be an integer{allowed}, got {value!r} ({type(value).__name__})." + hint
        )
    if (minimum is not None and index < minimum) or (maximum is not None and index > maximum):
        raise ValueError(f"{name} must be an integer{allowed}, got {index!r}." + hint)
    return int(index)


def _range(minimum: int | None, maximum: int | None) -> str:
    if minimum is not None and maximum is not None:
        return f" from {minimum} to {maximum}"
    if minimum is not None:
        return f" >= {minimum}"
    if maximum is not None:
        return f" <= {maximum}"
    return ""


def checked_positive_int(value, name: str) -> int:
    """`value` as an int >= 1, or a ValueError (also for a value that is no integer)."""
    if not is_int(value) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}.")
    return int(value)


def checked_even_width(width, name: str = "width") -> int:
    """`width` as a positive even int, or a ValueError that says why it must be."""
    if not is_int(width) or width <= 0:
        raise ValueError(f"{name} must be a positive even integer, got {width!r}.")
    if width % 2:
        raise ValueError(
            f"{name} must be even (channels come in sin/cos pairs), got {width}. Use an even width."
        )
    return int(width)


def checked_bool(value, name: str) -> bool:
    """`value` if it is a bool (Python or numpy), else a TypeError: strings are not coerced."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be True or False, got {value!r} ({type(value).__name__}).")
    return bool(value)


def checked_axis(value, name: str) -> int:
    """`value` as an axis index (an int, negative counts from the end), or a TypeError."""
    if not is_int(value):
        raise TypeError(f"{name} must be an integer axis, got {value!r} ({type(value).__name__}).")
    return int(value)


def checked_max_wavelength(max_wavelength) -> float:
    """`max_wavelength` as a float > 1, or a ValueError."""
    if isinstance(max_wavelength, (bool, np.bool_)) or not isinstance(
        max_wavelength, (*_INTEGER, float, np.floating)
    ):
        value = float("nan")
    else:
        value = float(max_wavelength)
    if not math.isfinite(value) or value <= 1.0:
        raise ValueError(
            f"max_wavelength must be a finite number > 1, got {max_wavelength!r} "
            "(10000.0 is the usual value)."
        )
    return value


def checked_choice(name: str, value, choices: Sequence[str]) -> str:
    """`value` if it is one of `choices`, else a ValueError listing them."""
    if not isinstance(value, str) or value not in choices:
        raise ValueError(f"Unknown {name} {value!r}; expected one of {tuple(choices)}.")
    return value


def rank_of(x) -> int | None:
    """The rank of a tensor or array `x` (None where a TensorFlow graph does not know it)."""
    shape = x.shape
    return len(shape) if isinstance(shape, tuple) else shape.rank


def checked_call_input(layer, inputs, rank: int, sizes: dict[int, int]) -> None:
    """Raise unless `inputs` is a float tensor of the rank and axis sizes the layer was built for.

    Integer, bool or complex inputs would come back in their own dtype with the table
    truncated into it; an input wider or narrower than the built one would be rotated in
    part or broadcast against the table: silent wrong answers.
    """
    name = type(layer).__name__
    dtype = keras.backend.standardize_dtype(inputs.dtype)
    if "float" not in dtype:
        raise TypeError(
            f"{name} needs a floating-point input, got dtype {dtype}. Cast it first "
            "(for token ids, embed them: keras.layers.Embedding)."
        )
    shape = inputs.shape
    given_rank = rank_of(inputs)
    if given_rank is not None and given_rank != rank:
        raise ValueError(
            f"{name} was built for inputs of rank {rank}, got shape {tuple(shape)}. Use a "
            "new layer for inputs of another rank."
        )
    for axis, size in sizes.items():
        given = shape[axis] if given_rank is not None else None
        if given is not None and size is not None and given != size:
            raise ValueError(
                f"{name} was built for inputs with {size} channels on axis {axis}, got shape "
                f"{tuple(shape)}. Use a new layer for inputs of another size."
            )


def checked_float_policy(layer) -> None:
    """Raise a TypeError unless the layer computes in a floating-point dtype."""
    compute = layer.dtype_policy.compute_dtype
    if not keras.backend.is_float_dtype(compute):
        raise TypeError(
            f"{type(layer).__name__} needs a floating-point dtype policy, got {compute!r}. "
            "Use dtype='float32' (or a mixed_float16 / mixed_bfloat16 policy)."
        )
