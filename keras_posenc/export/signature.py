"""The serving function every artifact is made from, and its explicit input signature."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from keras_posenc import _tf
from keras_posenc.export.errors import ExportError
from keras_posenc.export.model_inputs import model_inputs


def input_signature(model: keras.Model) -> list[tf.TensorSpec]:
    """One named `tf.TensorSpec` per model input, with the sizes the model's inputs fix.

    Axis 0 of an input is its batch and axis 1 its sequence: they stay dynamic where the
    model leaves them so (`keras.Input((None, 8))`) and keep their size where it fixes
    one (`keras.Input((16,))` is a sequence of 16; `keras.Input((4,))` four features, not
    a sequence). Other axes must have a size. A rank-0 input, such as a decoding
    `start_index`, stays a scalar.

    Args:
        model: a functional or `Sequential` Keras model (one with `model.inputs`).

    Returns:
        The specs in the order of `model.inputs`, named by the inputs' names.
    """
    inputs = model_inputs(model)
    specs = []
    for tensor in inputs:
        shape = list(tensor.shape)
        if any(size is None for size in shape[2:]):
            raise ExportError(
                f"Input {tensor.name!r} has shape {tuple(tensor.shape)}; only the batch "
                "(axis 0) and sequence (axis 1) may be unknown. Give the other axes a size "
                "in keras.Input(shape=...)."
            )
        specs.append(tf.TensorSpec(shape, tf.as_dtype(tensor.dtype), name=tensor.name))
    names = [spec.name for spec in specs]
    if len(set(names)) != len(names):
        raise ExportError(f"Model input names must be unique, got {names}.")
    return specs


def named_outputs(model: keras.Model, outputs) -> dict[str, tf.Tensor]:
    """The model's outputs as `{name: tensor}`: dict keys, else the model's output names."""
    if isinstance(outputs, dict):
        return dict(outputs)
    flat = keras.tree.flatten(outputs)
    names = list(getattr(model, "output_names", None) or [])  # Sequential models have none
    if len(names) != len(flat) or len(set(names)) != len(names):
        names = [f"output_{i}" for i in range(len(flat))]
    return dict(zip(names, flat, strict=True))


def _input_packer(model: keras.Model) -> Callable[[Sequence], Any]:
    """Packs tensors given in the order of `model.inputs` into what `model` takes."""
    try:
        structure = model.input  # a functional model's own structure (list, dict, ...)
    except AttributeError:  # a Sequential model: one input
        structure = None
    if isinstance(structure, (dict, list, tuple)):
        return lambda tensors: keras.tree.pack_sequence_as(structure, list(tensors))
    return lambda tensors: tensors[0] if len(tensors) == 1 else list(tensors)


def serving_function(model: keras.Model) -> tf.types.experimental.GenericFunction:
    """The model as a `tf.function` with an explicit named signature, returning `{name: tensor}`.

    Args:
        model: a functional or `Sequential` Keras model.

    Returns:
        A `tf.function` taking the inputs positionally in the order of `input_signature`.
    """
    specs = input_signature(model)
    pack = _input_packer(model)

    def serve(*tensors):
        return named_outputs(model, model(pack(tensors), training=False))

    return tf.function(serve, input_signature=specs, autograph=False)


def layers_in_scopes(model: keras.Model, scopes) -> list[str]:
    """The names of `model`'s layers that TensorFlow name scopes (`a_1/b_1/Op`) point into.

    TensorFlow adds `_1`, `_2` to the names of layers it traces; they are matched back.
    Each is given as its path of nested layers (`block_0/attention/query`), once.
    """
    names = {layer.name for layer in _tf.all_layers(model)} - {model.name}
    found = []
    for scope in scopes:
        parts = [re.sub(r"(_\d+)+$", "", part) for part in re.split(r"[/@]", scope)]
        path = "/".join(part for part in parts if part in names)
        if path and path not in found:
            found.append(path)
    return found


def export_bound(model: keras.Model, max_sequence_length: int | None = None) -> int | None:
    """The largest position + 1 an export of `model` serves, or None for no bound.

    `max_sequence_length` when given, else the smallest learned position table (the
    model allows no position past it). With a `start_index` input, `start_index` plus
    the sequence length must stay within it.

    Raises:
        ValueError: `max_sequence_length` is not a positive integer, or longer than a
            learned table of the model (its rows past the table do not exist) or than
            the positions the tables serve exactly (2^24).
    """
    from keras_posenc.frequencies import MAX_POSITIONS
    from keras_posenc.learned import LearnedPositionalEmbedding

    tables = [
        layer.max_length
        for layer in _tf.all_layers(model)
        if isinstance(layer, LearnedPositionalEmbedding)
    ]
    table = min(tables) if tables else None
    if max_sequence_length is None:
        return table
    if (
        isinstance(max_sequence_length, bool)
        or not isinstance(max_sequence_length, (int, np.integer))
        or max_sequence_length < 1
    ):
        raise ValueError(
            f"max_sequence_length must be a positive integer or None, got {max_sequence_length!r}."
        )
    if table is not None and max_sequence_length > table:
        raise ValueError(
            f"max_sequence_length {max_sequence_length} is longer than the model allows: its "
            f"learned position table has {table} rows. Use at most {table}."
        )
    if max_sequence_length > MAX_POSITIONS:
        raise ValueError(
            f"max_sequence_length {max_sequence_length} is past {MAX_POSITIONS}, the "
            "positions the tables serve exactly. Use at most that, or None."
        )
    return int(max_sequence_length)


@contextlib.contextmanager
def bounded_tracing(model: keras.Model, max_sequence_length: int | None) -> Iterator[None]:
    """While an export of `model` is traced: its position tables hold the rows below
    `export_bound(model, max_sequence_length)` only, and positions past it are bad."""
    with _tf.positions_bounded(export_bound(model, max_sequence_length)):
        yield
