"""`HostConstant`: a host array that a backend's graphs take as a constant.

Defined apart from the backends' tricks so that every backend's tables hold their host
arrays in it; what a constant is while tracing is the backend's (`tricks().traced_constant`).
"""

from __future__ import annotations

import numpy as np
from keras import ops

from keras_posenc.backend.lazy import tricks


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

    def tensor(self, traced: bool):
        """The array as a tensor: a constant of the graph being traced, else one cached
        tensor. `traced`: whether the call is traced (its input or its start)."""
        t = tricks()
        if traced:
            return t.traced_constant(self, (), lambda: self.array)
        if self._eager_tensor is None:
            tensor = ops.convert_to_tensor(self.array)
            if t.is_traced(tensor):
                # Made inside a trace all the same (JAX: a call whose values are constants
                # of a `jax.jit`): kept, it would outlive the trace and fail every call.
                return tensor
            self._eager_tensor = tensor
        return self._eager_tensor

    def rows(self, start, length, traced: bool):
        """Rows `start .. start + length - 1`: when both are ints and a graph is traced,
        a constant of just those rows, so a trace embeds no more of the table than it uses
        (a retrace per Python-int start would otherwise copy the whole table each time)."""
        t = tricks()
        if (
            isinstance(start, (int, np.integer))
            and isinstance(length, (int, np.integer))
            and traced
        ):
            return t.traced_constant(
                self, (int(start), int(length)), lambda: self.array[start : start + length]
            )
        return t.slice_rows(self.tensor(traced), start, length)
