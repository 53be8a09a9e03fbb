"""A Keras variable's value as a numpy array, without a copy where the backend allows.

A decoder's description (`description.py`, `keras_posenc.keras_hub`) holds every weight
as a numpy array. Made with `keras.ops.convert_to_numpy`, on TensorFlow that is a second
copy of the model's weights, and a model that does not fit twice in memory cannot be
exported (issue 39). A tensor read from a TensorFlow variable aliases the variable's
buffer, and numpy views that tensor (read-only): no copy. TensorFlow copies the buffer
when the variable is assigned while the view lives (copy on write), so the array keeps
the value it was read with. A JAX variable's array is immutable (an assignment makes a
new one) and numpy views it on the CPU. A PyTorch variable is assigned in place, so its
value is copied (`convert_to_numpy`), as before.
"""

from __future__ import annotations

import keras
import numpy as np


def weight_array(variable) -> np.ndarray:
    """`variable`'s value as a float32 array; a read-only view of its buffer on TensorFlow
    and JAX (a copy where it is not float32, and on PyTorch).

    Example:

    ```python
    kernel = weight_array(layer.kernel)  # no second copy of the kernel
    ```
    """
    backend = keras.backend.backend()
    if backend == "tensorflow" and isinstance(variable, keras.Variable):
        value = np.asarray(variable.value.read_value())
    elif backend == "jax" and isinstance(variable, keras.Variable):
        value = np.asarray(variable.value)
    else:
        value = keras.ops.convert_to_numpy(variable)
    return np.asarray(value, np.float32)
