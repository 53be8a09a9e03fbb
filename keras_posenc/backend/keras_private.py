"""Every private Keras API the package touches, each behind a named function.

Keras's own, on every backend (no TensorFlow here): nothing else in the package imports
`keras.src` or reads a `_`-attribute of a Keras object, so when a release moves one of
these, this is the one file to change (TensorFlow's are in
`keras_posenc.backend.tensorflow.private`). Each says why no public API serves.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator

# Keras's own masks on tensors (what MultiHeadAttention reads and sets); no public API.
from keras.src.backend.common.masking import get_keras_mask, set_keras_mask  # noqa: F401

# --------------------------------------------------------------------------------------
# Keras: models and layers


def all_layers(model) -> list:
    """The model and every layer in it, nested ones included (Keras has no public walk)."""
    return list(model._flatten_layers(include_self=True, recursive=True))


def call_keyword_arguments(layer) -> list[dict]:
    """The keyword arguments of each call of `layer` in a functional model, one dict a call.

    Keras keeps them on the layer's inbound nodes; no public API lists a layer's calls.
    """
    calls = []
    for node in getattr(layer, "_inbound_nodes", []):
        arguments = getattr(node, "arguments", None)
        calls.append(dict(getattr(arguments, "kwargs", None) or {}))
    return calls


def replace_weight(layer, old, make_new: Callable):
    """Untrack `old` from `layer` and track `make_new()` in its place; returns the new weight.

    Keras locks a built layer's state: there is no public way to swap one of its weights
    (needed to resize a learned table).
    """
    layer._untrack_variable(old)
    layer._tracker.unlock()
    try:
        return make_new()
    finally:
        layer._lock_state()


# --------------------------------------------------------------------------------------
# Keras: a quantized layer's stored integers (`model.quantize(mode)`)

# Keras keeps a quantized Dense / EinsumDense's integers in `_kernel` (its public `kernel`
# unpacks or dequantizes them), an Embedding's in `_embeddings`, and an int4 layer's block
# size in `_int4_block_size`; an EinsumDense's contracted kernel axes in
# `_kernel_reduced_axes`. No public API gives the stored form.
_QUANTIZED_PARTS = frozenset(
    {"kernel", "embeddings", "int4_block_size", "kernel_reduced_axes", "orig_output_dim"}
)


def quantized_part(layer, name: str, default=None):
    """The private part `name` of a quantized Keras layer (`_QUANTIZED_PARTS`), or
    `default` where the layer has none."""
    if name not in _QUANTIZED_PARTS:
        raise AttributeError(f"{name!r} is not a part of a quantized Keras layer read here.")
    return getattr(layer, "_" + name, default)


# --------------------------------------------------------------------------------------
# Keras: the attention layers' parts

# What the rotary attention layers reuse of Keras's `MultiHeadAttention` and
# `GroupQueryAttention`, which keep them private: the projections, the dropout on the
# scores, the flash-attention switch, the scale and (MultiHeadAttention) the window and gate.
_ATTENTION_PARTS = frozenset(
    {
        "query_dense",
        "key_dense",
        "value_dense",
        "output_dense",
        "gate_dense",
        "dropout_layer",
        "flash_attention",
        "inverse_sqrt_key_dim",
        "inverse_sqrt_head_dim",
        "sliding_window",
        "use_gate",
    }
)


def attention_part(layer, name: str):
    """The private part `name` (`"query_dense"`, ...: `_ATTENTION_PARTS`) of a Keras
    attention layer."""
    if name not in _ATTENTION_PARTS:
        raise AttributeError(f"{name!r} is not a part of a Keras attention layer read here.")
    return getattr(layer, "_" + name)


def attention_mask(layer, query, value, **masks):
    """The Keras attention layer's own mask from its query/value/key/attention masks and
    `use_causal_mask` (`_compute_attention_mask`)."""
    return layer._compute_attention_mask(query, value, **masks)


def causal_mask(layer, query, value):
    """The Keras attention layer's causal mask of `(query, value)` (`_compute_causal_mask`)."""
    return layer._compute_causal_mask(query, value)


def masked_softmax(layer, scores, mask):
    """The Keras attention layer's softmax of `scores` with `mask` (`_masked_softmax`)."""
    return layer._masked_softmax(scores, mask)


class _NoTensorFlow:
    available = False


@contextlib.contextmanager
def serialization_without_tensorflow() -> Iterator[None]:
    """Keras's serialization (a layer's `get_config`, an initializer's `serialize`) asks
    `tf.available` to recognise TensorShape / DType values, which imports TensorFlow where
    it is installed; a config read off TensorFlow holds none of them, so while this block
    runs the answer is no (TensorFlow already imported: nothing changes)."""
    from keras.src.saving import serialization_lib

    if "tensorflow" in sys.modules:
        yield
        return
    saved = serialization_lib.tf
    serialization_lib.tf = _NoTensorFlow()
    try:
        yield
    finally:
        serialization_lib.tf = saved
