"""What the attention layers' shared call needs of TensorFlow: the few places it differs.

`keras_posenc.layers.kv_cache`, `attend` and `rotary_attention_call` are written once, in
`keras.ops`; where TensorFlow needs its own op to keep its graphs (and their exports) as
they are, or has something no other backend has (values known while tracing, graph
assertions, a `tf.function` traced with or without XLA), they ask the backend's tricks
module: this one (re-exported by `keras_posenc.backend.tensorflow`), or
`keras_posenc.backend.keras_ops` on JAX and PyTorch, which has the same names.
"""

from __future__ import annotations

import tensorflow as tf

from keras_posenc.backend.tensorflow.tracing import in_xla_context
from keras_posenc.backend.tensorflow.values import static_value  # noqa: F401  the attention call asks it


def asserted(condition, message: list):
    """`condition`, after a graph assertion of it where a graph is traced (XLA and the
    converters drop it; the callers also make the outputs NaN by it)."""
    if tf.executing_eagerly():
        return condition
    assertion = tf.debugging.Assert(condition, message)
    with tf.control_dependencies([assertion]):
        return tf.identity(condition)


def run_time_size(x, axis: int):
    """The size of `x` along `axis` as a scalar int32 tensor (`tf.shape`)."""
    return tf.shape(x)[axis]


def run_time_shape(x):
    """The shape of `x` as an int32 vector (`tf.shape`)."""
    return tf.shape(x)


def take(x, indices, axis: int):
    """`tf.gather`: `keras.ops.take` adds a select for negative indices (never given here)."""
    return tf.gather(x, indices, axis=axis)


def writes_in_place() -> bool:
    """Whether a cache write is a dynamic update slice: under XLA. Elsewhere a select over
    the slots, which tf2onnx and the TFLite converter convert (XlaDynamicUpdateSlice they
    do not)."""
    return in_xla_context()


def positions_of_padding(mask, start_index=0):
    """`keras_posenc.tables.positions.positions_from_mask`: a padded row's positions, checked."""
    from keras_posenc.tables.positions import positions_from_mask

    return positions_from_mask(mask, start_index)
