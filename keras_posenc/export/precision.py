"""What precision a model is exported in: bfloat16 models become float32 copies."""

from __future__ import annotations

import warnings

import keras
import numpy as np

from keras_posenc.backend import keras_private
from keras_posenc.export.errors import ExportError
from keras_posenc.export.model_inputs import model_inputs

BFLOAT16_CHOICES = ("float32", "error")
_LOW_PRECISION = ("float16", "bfloat16")


def compute_dtypes(model: keras.Model) -> set[str]:
    """The compute dtypes of the model's layers and the dtypes of its float variables."""
    dtypes = {
        layer.dtype_policy.compute_dtype
        for layer in keras_private.all_layers(model)
        if getattr(layer, "dtype_policy", None) is not None
    }
    dtypes.update(v.dtype for v in model.weights if keras.backend.is_float_dtype(v.dtype))
    return {keras.backend.standardize_dtype(d) for d in dtypes}


def float32_copy(model: keras.Model) -> keras.Model:
    """A copy of `model` that computes and stores everything in float32, with the same weights.

    Every dtype policy (`bfloat16`, `mixed_bfloat16`, `float16`, `mixed_float16`) and every
    low-precision input dtype in the model's config becomes `float32`; weights are cast up
    (exactly: float32 holds every bfloat16 and float16 value).

    Args:
        model: a Keras model whose config round-trips (`get_config` / `from_config`).

    Returns:
        A new model.
    """
    config = _float32_config(keras.saving.serialize_keras_object(model))
    copy = keras.saving.deserialize_keras_object(config)
    _quantize_like(copy, model)
    weights = model.get_weights()
    copy.set_weights(
        [
            w.astype(np.float32)
            if keras.backend.standardize_dtype(w.dtype) in _LOW_PRECISION
            else w
            for w in weights
        ]
    )
    return copy


def _quantize_like(copy: keras.Model, model: keras.Model) -> None:
    """Quantizes each layer of `copy` that is quantized in `model` but was not rebuilt
    quantized from the config (a layer made inside another's `__init__`, quantized after
    it: its config does not say so), with the mode and block size of `model`'s layer, so
    that both hold the same variables; `float32_copy` then gives them `model`'s values."""
    layers = keras_private.all_layers(model)
    if not any(_quantization_mode(layer) for layer in layers):
        return  # a float model: nothing to pair
    for layer, copied in zip(layers, keras_private.all_layers(copy), strict=True):
        mode = _quantization_mode(layer)
        if mode is None or _quantization_mode(copied):
            continue
        config = getattr(layer, "quantization_config", None)
        block_size = getattr(layer.dtype_policy, "block_size", None)
        if config is None and mode == "int4" and block_size is not None:
            config = keras.quantizers.Int4QuantizationConfig(block_size=block_size)
        copied.quantize(mode, type_check=False, config=config)


def _quantization_mode(layer) -> str | None:
    return getattr(getattr(layer, "dtype_policy", None), "quantization_mode", None)


def _float32_config(config):
    if isinstance(config, dict):
        result = {}
        for key, value in config.items():
            if key == "dtype" and isinstance(value, str) and is_low_precision(value):
                value = "float32"
            elif (
                key in ("dtype", "dtype_policy")
                and isinstance(value, dict)
                and value.get("class_name") == "DTypePolicy"
            ):
                value = {**value, "config": {**value["config"], "name": "float32"}}
            elif (
                key in ("dtype", "dtype_policy")
                and isinstance(value, dict)
                and is_low_precision(value.get("config", {}).get("source_name") or "")
            ):  # a quantized layer's policy (`int8_from_bfloat16`): its source becomes float32
                value = {**value, "config": {**value["config"], "source_name": "float32"}}
            result[key] = _float32_config(value)
        return result
    if isinstance(config, list):
        return [_float32_config(value) for value in config]
    return config


def is_low_precision(dtype_name: str) -> bool:
    """Whether a dtype or dtype policy name (`"bfloat16"`, `"mixed_float16"`) computes below
    float32, so that the package exports a float32 copy of its model."""
    return dtype_name.removeprefix("mixed_") in _LOW_PRECISION


# Why each dtype is exported as a float32 copy (see `exportable_model`).
_REASONS = {
    "bfloat16": "tf2onnx writes a broken graph for bfloat16, tensorflow-onnx#2337, and "
    "onnxruntime's CPU has no bfloat16 MatMul",
    "float16": "the files are float32, verified against Keras in float32",
}


def exportable_model(
    model: keras.Model, bfloat16: str = "float32", copied: tuple[str, ...] = ("bfloat16",)
) -> tuple[keras.Model, list]:
    """The model to export and notes on what was changed.

    bfloat16 cannot go to ONNX: tf2onnx maps it to float16 and writes a broken graph
    (tensorflow-onnx#2337), and onnxruntime's CPU has no bfloat16 MatMul. A model that uses
    a dtype of `copied` anywhere (bfloat16; the decoder export adds float16, its files
    being float32) is exported as its `float32_copy` (`bfloat16="float32"`, with a warning
    naming the dtype) or refused (`bfloat16="error"`): the argument keeps its name and
    covers every dtype of `copied`.

    Raises:
        ValueError: `bfloat16` is neither `"float32"` nor `"error"`.
        ExportError: the model uses a dtype of `copied` and `bfloat16="error"`.
    """
    if bfloat16 not in BFLOAT16_CHOICES:
        raise ValueError(f"bfloat16 must be one of {BFLOAT16_CHOICES}, got {bfloat16!r}.")
    model_inputs(model)
    used = [dtype for dtype in copied if dtype in compute_dtypes(model)]
    if not used:
        return model, []
    dtypes = " and ".join(used)
    reasons = "; ".join(_REASONS[dtype] for dtype in used)
    if bfloat16 == "error":
        raise ExportError(
            f"The model {model.name!r} uses {dtypes}, which is not exported ({reasons}). "
            "Export a float32 copy: pass bfloat16='float32' (the setting covers every "
            "low-precision dtype), or call keras_posenc.export.float32_copy(model) and "
            "export that."
        )
    note = (
        f"The model {model.name!r} uses {dtypes}; exported a float32 copy with the same "
        f"weights instead ({reasons})."
    )
    warnings.warn(note, stacklevel=3)
    return float32_copy(model), [note]
