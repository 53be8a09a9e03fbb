"""Every private TensorFlow and Keras API the package touches, each behind a named function.

Nothing else in the package imports `tensorflow.python`, `keras.src` or reads a `_`-attribute
of a TensorFlow or Keras object: when a release moves one of these, this is the one file to
change. Each says why no public API serves.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import tensorflow as tf

# Keras's own masks on tensors (what MultiHeadAttention reads and sets); no public API.
from keras.src.backend.common.masking import get_keras_mask, set_keras_mask

# XLA's dynamic slice (no public op takes a run-time start under XLA without making it a
# compile-time constant).
from tensorflow.compiler.tf2xla.python import xla

# Freezing a concrete function's variables into constants (the LiteRT export needs it).
from tensorflow.python.framework.convert_to_constants import convert_variables_to_constants_v2

# The XLA-context test (no public API says whether the graph being traced will be compiled).
from tensorflow.python.ops import control_flow_util
from tensorflow.python.util import nest

__all__ = [
    "AutoTrackable",
    "all_layers",
    "attention_mask",
    "attention_part",
    "call_keyword_arguments",
    "causal_mask",
    "frozen_named_outputs",
    "get_keras_mask",
    "graph_functions",
    "graph_in_xla_context",
    "masked_softmax",
    "replace_weight",
    "saved_model_proto",
    "set_keras_mask",
    "tflite_schema",
    "xla",
]

# --------------------------------------------------------------------------------------
# TensorFlow


def graph_functions(graph: tf.Graph) -> dict:
    """The function definitions a graph holds, by name (what tf2onnx's `resolve_functions`
    walks, read the way it reads them; no public API lists them with their definitions)."""
    return graph._functions


def graph_in_xla_context() -> bool:
    """Whether the graph being traced will be compiled by XLA (`jit_compile=True`)."""
    return control_flow_util.GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph())


# What `keras.export.ExportArchive.track` takes: an object whose attributes TensorFlow's
# checkpoint walks (a `tf.Module` would list the model's variables as its own).
AutoTrackable = tf.__internal__.tracking.AutoTrackable


def frozen_named_outputs(concrete) -> Callable:
    """`concrete` (a concrete function returning a dict) with its variables made constants.

    Freezing flattens the outputs in `tf.nest.flatten` order; the function returned takes
    the same inputs and gives them back as `{name: tensor}` under their names again.
    """
    frozen = convert_variables_to_constants_v2(concrete, lower_control_flow=False)
    names = [path[0] for path, _ in nest.flatten_with_tuple_paths(concrete.structured_outputs)]

    def serve(*tensors):
        return dict(zip(names, nest.flatten(frozen(*tensors)), strict=True))

    return serve


def tflite_schema():
    """The flatbuffer schema of `.tflite` files (TensorFlow ships no public reader)."""
    from tensorflow.lite.python import schema_py_generated

    return schema_py_generated


def saved_model_proto(path: str | os.PathLike):
    """The `SavedModel` protocol buffer of the SavedModel folder `path` (its graphs)."""
    from tensorflow.core.protobuf import saved_model_pb2

    proto = saved_model_pb2.SavedModel()
    proto.ParseFromString((Path(path) / "saved_model.pb").read_bytes())
    return proto


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
