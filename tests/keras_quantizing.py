"""Keras's `quantize()` without a full garbage collection for each variable it replaces.

`keras.Layer.__delattr__` runs `gc.collect()` after each variable it deletes (to free a
device buffer sooner), and `quantize` deletes each kernel it replaces: a full collection of
the test session's heap per kernel, which grows with every model the session has built
(7-8 s CPU a tiny model late in tests/test_decoder_keras_quantized.py, more in the whole
suite's heap). Nothing the tests look at is freed by it; Python's own collections still
run.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

import keras
import pytest


@contextlib.contextmanager
def without_collection_per_variable() -> Iterator[None]:
    """Within it, `keras.Layer.__delattr__` deletes a variable as Keras does, but for its
    `gc.collect()`.

    Example:

    ```python
    with without_collection_per_variable():
        causal_lm.quantize("int8")
    ```
    """
    delete = keras.Layer.__delattr__

    def delete_without_collecting(layer, name):
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(gc, "collect", lambda generation=2: 0)
            delete(layer, name)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(keras.Layer, "__delattr__", delete_without_collecting)
        yield
