"""Argument checks shared by the layers: each returns the clean value or raises a clear error.

Constructor arguments are checked for their type as well as their value: `"False"` is not a
bool and `1.9` is not an axis, so neither is coerced into a plausible setting. Values that
may only be known while a graph runs (positions, start indices) go through `check`, which
raises now when it can and becomes a graph assertion otherwise.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import keras
import numpy as np

from keras_posenc._lazy import tf

_INTEGER = (int, np.integer)


def is_int(value) -> bool:
    """Whether `value` is a Python or numpy integer (bools are not)."""
    return isinstance(value, _INTEGER) and not isinstance(value, (bool, np.bool_))


def checked_int(value, name: str, minimum: int | None = None) -> int:
    """`value` as an int, at least `minimum` when given, or a TypeError / ValueError."""
    if not is_int(value):
        raise TypeError(f"{name} must be an integer, got {value!r} ({type(value).__name__}).")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}.")
    return int(value)


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


def checked_call_input(layer, inputs, rank: int, sizes: dict[int, int]) -> None:
    """Raise unless `inputs` is a float tensor of the rank and axis sizes the layer was built for.

    Integer, bool or complex inputs would come back in their own dtype with the table
    truncated into it; an input wider or narrower than the built one would be rotated in
    part or broadcast against the table: silent wrong answers.
    """
    name = type(layer).__name__
    dtype = tf.as_dtype(inputs.dtype)
    if not dtype.is_floating:
        raise TypeError(
            f"{name} needs a floating-point input, got dtype {dtype.name}. Cast it first "
            "(for token ids, embed them: keras.layers.Embedding)."
        )
    shape = inputs.shape
    if shape.rank is not None and shape.rank != rank:
        raise ValueError(
            f"{name} was built for inputs of rank {rank}, got shape {tuple(shape)}. Use a new "
            "layer for inputs of another rank."
        )
    for axis, size in sizes.items():
        given = shape[axis] if shape.rank is not None else None
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


def check(predicate: Callable, values: list, message: Callable, error=ValueError) -> list:
    """Raise `error(message(*values))` unless `predicate(*values)` holds for every element.

    With every value known (Python numbers, eager or constant tensors) the check runs now
    and `[]` is returned; otherwise the check is a graph assertion, returned in a list so
    the caller can make the computation wait for it (a slice could otherwise fail first,
    with a message about the slice instead of the input). Converters and XLA drop
    assertions: callers also poison the rows (see `_tf.nan_unless`).
    """
    # tf.is_tensor is slow on Python numbers (a Protocol check): test for them first.
    known = [v if isinstance(v, _INTEGER) else tf.get_static_value(v) for v in values]
    if all(k is not None for k in known):
        if not np.all(predicate(*known)):
            raise error(message(*(np.asarray(k).tolist() for k in known)))
        return []
    values = [tf.convert_to_tensor(v) for v in values]
    tensors = [tf.cast(v, tf.int64) for v in values]
    # Shown as int32 where they are: an Assert whose data are all int32 or strings is one
    # op; with int64 data it is wrapped in a conditional (several ops a call in a graph).
    shown = [v if v.dtype == tf.int32 else t for v, t in zip(values, tensors, strict=True)]
    return [
        tf.debugging.Assert(
            tf.reduce_all(predicate(*tensors)),
            [message(*["(value below)"] * len(values)), *shown],
        )
    ]


def after(checks: list, tensor):
    """`tensor`, computed only once `checks` (graph assertions) have passed."""
    if not checks:
        return tensor
    with tf.control_dependencies(checks):
        return tf.identity(tensor)
