"""Values in TensorFlow's graphs: known while tracing, or only at run time.

The names of `keras_posenc.backend.keras_ops.values`, TensorFlow's answers (re-exported by
`keras_posenc.backend.tensorflow`): a value is known while tracing when TensorFlow can fold it
(`tf.get_static_value`), and a graph is traced whenever TensorFlow is not executing
eagerly; a size unknown while tracing is a tensor, never a symbolic size.
"""

from __future__ import annotations

import tensorflow as tf


def static_value(value):
    """`value` as a numpy value when it is known while tracing (eager, a constant), else None."""
    return tf.get_static_value(value)


def is_traced(x=None) -> bool:
    """Whether a graph is being traced (`x`, the tensor at hand, says nothing more here)."""
    del x
    return not tf.executing_eagerly()


def is_symbolic(size) -> bool:
    """Never: a size TensorFlow does not know while tracing is a tensor (`tf.shape`)."""
    del size
    return False
