"""Every private TensorFlow API the package touches, each behind a named function.

Nothing else in the package imports `tensorflow.python` or reads a `_`-attribute of a
TensorFlow object (Keras's private parts, which every backend uses, are in
`keras_posenc.backend.keras_private`, re-exported here): when a release moves one of these, this
is the one file to change. Each says why no public API serves.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import tensorflow as tf

# XLA's dynamic slice (no public op takes a run-time start under XLA without making it a
# compile-time constant).
from tensorflow.compiler.tf2xla.python import xla

# Freezing a concrete function's variables into constants (the LiteRT export needs it).
from tensorflow.python.framework.convert_to_constants import convert_variables_to_constants_v2

# The XLA-context test (no public API says whether the graph being traced will be compiled).
from tensorflow.python.ops import control_flow_util
from tensorflow.python.util import nest

from keras_posenc.backend.keras_private import (  # noqa: F401  re-exported
    all_layers,
    attention_mask,
    attention_part,
    call_keyword_arguments,
    causal_mask,
    get_keras_mask,
    masked_softmax,
    replace_weight,
    set_keras_mask,
)

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
