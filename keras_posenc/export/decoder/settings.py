"""Settings a layer has that the decoder description does not carry, refused by name.

A layer's `get_config()` is compared with its constructor's defaults (every class of its
MRO): a key set to something else that the description neither reads (`carried`) nor
can ignore at inference (the name, dtype, trainability, seeds, dropout, initialisers,
regularisers, constraints) changes what the layer computes in a way the file would not,
so it is refused with the layer, the key and its value. New options the layers grow are
refused the same way until the description reads them.
"""

from __future__ import annotations

import inspect

from keras_posenc.backend import keras_private
from keras_posenc.export.errors import ExportError

# Keys of every Keras layer's config that do not change what it computes at inference.
_INFERENCE_NEUTRAL = {"name", "trainable", "dtype", "seed", "dropout", "flash_attention"}
_NEUTRAL_SUFFIXES = ("_initializer", "_regularizer", "_constraint")


def _defaults(cls) -> dict:
    """Each keyword's default, the most derived class's first (absent: no default)."""
    defaults = {}
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        try:
            parameters = inspect.signature(init).parameters.values()
        except (TypeError, ValueError):  # a builtin's __init__
            continue
        for parameter in parameters:
            if parameter.default is not inspect.Parameter.empty:
                defaults.setdefault(parameter.name, parameter.default)
    return defaults


def _plain(value):
    """Tuples as lists, so that a config's list equals a default's tuple."""
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    return value


_MISSING = object()


def unread_settings(layer, carried: set[str], required: dict | None = None) -> dict:
    """`{key: value}` of `layer`'s config that the export would drop.

    Args:
        layer: a Keras layer.
        carried: the config keys the description reads (or refuses itself by value).
        required: keys whose value must be this one (not the constructor's default).
    """
    required = required or {}
    defaults = _defaults(type(layer))
    unread = {}
    with keras_private.serialization_without_tensorflow():  # off TensorFlow, none imported
        config = layer.get_config()
    for key, value in config.items():
        if key in _INFERENCE_NEUTRAL or key.endswith(_NEUTRAL_SUFFIXES):
            continue
        if key in required:
            if _plain(value) != _plain(required[key]):
                unread[key] = value
            continue
        if key in carried:
            continue
        default = defaults.get(key, _MISSING)
        if default is _MISSING or _plain(value) != _plain(default):
            unread[key] = value
    return unread


def refuse_unread_settings(
    layer, carried: set[str], what: str, required: dict | None = None
) -> None:
    """Raises an ExportError naming `layer` and each setting of `unread_settings`.

    Raises:
        ExportError: `layer` has a setting the export does not carry.
    """
    unread = unread_settings(layer, carried, required)
    if not unread:
        return
    settings = ", ".join(f"{key}={value!r}" for key, value in unread.items())
    raise ExportError(
        f"{type(layer).__name__} {layer.name!r} has settings {what} does not write: "
        f"{settings}. The file would compute without them; export a model without them "
        "(or with their default values)."
    )


# The config keys `describe_decoder` reads from a DecoderBlock and its attention (or
# refuses by value itself: biases, a gate, a window).
_ROPE_KEYS = {"rope_max_wavelength", "rope_layout", "rope_dim", "rope_scaling"}
_HEAD_KEYS = {"head_dim", "num_query_heads", "num_key_value_heads"}
_NORM_KEYS = {"query_key_norm", "query_key_norm_epsilon"}
# `layer_norm_epsilon` is read from the block's RMSNormalization layers.
_BLOCK_KEYS = {*_ROPE_KEYS, *_HEAD_KEYS, *_NORM_KEYS, "intermediate_dim", "mlp"}
_BLOCK_KEYS.add("layer_norm_epsilon")
_ATTENTION_KEYS = {*_ROPE_KEYS, *_HEAD_KEYS, *_NORM_KEYS, "use_bias", "use_gate"}
_ATTENTION_KEYS.add("sliding_window")
# Positions count the real tokens of a row (left padding), as the files' do.
_ATTENTION_REQUIRED = {"positions_from_mask": True}


def refuse_unread_block_settings(block) -> None:
    """`refuse_unread_settings` for a `DecoderBlock` and its attention layer."""
    refuse_unread_settings(block, _BLOCK_KEYS, "save_decoder")
    refuse_unread_settings(block.attention, _ATTENTION_KEYS, "save_decoder", _ATTENTION_REQUIRED)
