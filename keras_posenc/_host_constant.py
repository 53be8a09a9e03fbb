"""`HostConstant`: a host array that a backend's graphs take as a constant.

Defined apart from the backends' tricks so that every backend's tables hold their host
arrays in it; what a constant is while tracing is the backend's (`tricks().traced_constant`).
"""

from __future__ import annotations

import numpy as np
from keras import ops

from keras_posenc._lazy import tricks


class HostConstant:
    """A host array that becomes a graph constant when traced and a cached tensor eagerly.

    A `tf.constant` made eagerly and captured by a traced function turns into an extra,
    unfeedable input of an exported ONNX graph; one made while tracing is a plain
    constant node. Eager calls reuse one tensor instead of copying the array every call
    (on a GPU, milliseconds for the split tables: docs/gpu.md). While a SavedModel is
    traced (`tables_stored_once`) every use shares one copy.
    """

    def __init__(self, array: np.ndarray):
        self.array = array
        self._eager_tensor = None

    def tensor(self, traced: bool | None = None):
        """The array as a tensor: a constant of the graph being traced, else one cached
        tensor. `traced`: whether a graph is traced (None: TensorFlow says)."""
        t = tricks()
        if not (t.is_traced() if traced is None else traced):
            if self._eager_tensor is None:
                self._eager_tensor = ops.convert_to_tensor(self.array)
            return self._eager_tensor
        return t.traced_constant(self, (), lambda: self.array)

    def rows(self, start, length, traced: bool | None = None):
        """Rows `start .. start + length - 1`: when both are ints and a graph is traced,
        a constant of just those rows, so a trace embeds no more of the table than it uses
        (a retrace per Python-int start would otherwise copy the whole table each time)."""
        t = tricks()
        traced = t.is_traced() if traced is None else traced
        if (
            isinstance(start, (int, np.integer))
            and isinstance(length, (int, np.integer))
            and traced
        ):
            return t.traced_constant(
                self, (int(start), int(length)), lambda: self.array[start : start + length]
            )
        return t.slice_rows(self.tensor(traced), start, length)
