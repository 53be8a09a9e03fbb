"""A Keras variable's value as a numpy array, without a copy where the backend allows.

A decoder's description (`description.py`, `keras_posenc.keras_hub`) holds every weight
as a numpy array. Made with `keras.ops.convert_to_numpy`, on TensorFlow that is a second
copy of the model's weights, and a model that does not fit twice in memory cannot be
exported (issue 39). A tensor read from a TensorFlow variable aliases the variable's
buffer, and numpy views that tensor (read-only): no copy. TensorFlow copies the buffer
when the variable is assigned while the view lives (copy on write), so the array keeps
the value it was read with. JAX's and PyTorch's CPU arrays convert without a copy
already.
"""

from __future__ import annotations

import keras
import numpy as np


def weight_array(variable) -> np.ndarray:
    """`variable`'s value as a float32 array; a read-only view of its buffer on TensorFlow
    (a copy only where it is not float32).

    Example:

    ```python
    kernel = weight_array(layer.kernel)  # no second copy of the kernel
    ```
    """
    if keras.backend.backend() == "tensorflow" and isinstance(variable, keras.Variable):
        value = np.asarray(variable.value.read_value())
    else:
        value = keras.ops.convert_to_numpy(variable)
    return np.asarray(value, np.float32)
