"""The graph being traced on JAX and PyTorch: the names of
`keras_posenc.backend.tensorflow.tracing`.

JAX compiles what it traces with XLA, where nothing asserts; exports with a bound on the
positions and SavedModels that store each table once are TensorFlow's.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from keras import ops


def in_xla_context() -> bool:
    """True: JAX compiles what it traces with XLA, whose conditionals fuse what follows
    them into their branches (a PyTorch eager call has no run-time choice to make)."""
    return True


def assertions_dropped() -> bool:
    """Always: nothing asserts here (a bad traced value makes NaN rows)."""
    return True


def traced_constant(owner, key: tuple, array: Callable[[], np.ndarray]):
    """A constant of `array()` in the graph being traced."""
    del owner, key
    return ops.convert_to_tensor(array())


def shared_while_stored(owner, key: tuple, compute: Callable) -> Callable:
    """`compute`: a SavedModel is TensorFlow's
    (`keras_posenc.backend.tensorflow.shared_while_stored`)."""
    return compute


def position_bound() -> None:
    """None: bounds are for TensorFlow's exports
    (`keras_posenc.backend.tensorflow.positions_bounded`)."""
    return None
