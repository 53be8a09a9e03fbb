"""`HostConstant`: a host array that TensorFlow's graphs take as a constant.

Defined apart from `keras_posenc._tf` so that every backend's tables can hold their host
arrays in it without importing TensorFlow (JAX and PyTorch read `.array` alone).
"""

from __future__ import annotations

import numpy as np

from keras_posenc._lazy import _tf, tf


class HostConstant:
    """A host array that becomes a graph constant when traced and a cached tensor eagerly.

    A `tf.constant` made eagerly and captured by a traced function turns into an extra,
    unfeedable input of an exported ONNX graph; one made while tracing is a plain
    constant node. Eager calls reuse one tensor instead of copying the array every call.
    While a SavedModel is traced (`tables_stored_once`) every use shares one copy.
    """

    def __init__(self, array: np.ndarray):
        self.array = array
        self._eager_tensor = None

    def tensor(self) -> tf.Tensor:
        if tf.executing_eagerly():
            if self._eager_tensor is None:
                self._eager_tensor = tf.constant(self.array)
            return self._eager_tensor
        return _tf.traced_constant(self, (), lambda: self.array)

    def rows(self, start, length) -> tf.Tensor:
        """Rows `start .. start + length - 1`: when both are ints and a graph is traced,
        a constant of just those rows, so a trace embeds no more of the table than it uses
        (a retrace per Python-int start would otherwise copy the whole table each time)."""
        if (
            isinstance(start, (int, np.integer))
            and isinstance(length, (int, np.integer))
            and not tf.executing_eagerly()
        ):
            return _tf.traced_constant(
                self, (int(start), int(length)), lambda: self.array[start : start + length]
            )
        return _tf.slice_rows(self.tensor(), start, length)
