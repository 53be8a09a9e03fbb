"""The graph being traced: where it runs (XLA, on which device) and what it is for.

What an export or a converter sets while it traces (`tables_stored_once`,
`positions_bounded`, `tracing_for_a_converter`) and what the layers' graphs read of it, per
thread, so that concurrent traces keep their own. Re-exported by `keras_posenc.backend.tensorflow`.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator

import numpy as np
import tensorflow as tf

from keras_posenc.backend.tensorflow.private import graph_in_xla_context

# --------------------------------------------------------------------------------------
# Where the graph runs


def in_xla_context() -> bool:
    """Whether the graph being traced will be compiled by XLA (`jit_compile=True`)."""
    return graph_in_xla_context()


def xla_on_cpu() -> bool:
    """Whether this process compiles XLA for the CPU (no GPU or TPU is visible).

    The channel swap's forms (`tf_backend.swap_form`) were measured on XLA:CPU only; other
    devices take the default.
    """
    return not (tf.config.list_logical_devices("GPU") or tf.config.list_logical_devices("TPU"))


# --------------------------------------------------------------------------------------
# What an export traces for: host tables stored once, a bound on the positions

# What the graph being traced is for (an export, a converter): per thread, so that
# concurrent traces keep their own.
_tracing = threading.local()


@contextlib.contextmanager
def _while_tracing(name: str, value) -> Iterator[None]:
    previous = getattr(_tracing, name, None)
    setattr(_tracing, name, value)
    try:
        yield
    finally:
        setattr(_tracing, name, previous)


def tables_stored_once() -> contextlib.AbstractContextManager[None]:
    """While a SavedModel is traced: every use of a host table refers to one stored copy.

    A constant made while tracing is a node of the function that uses it, and every use
    (each layer, each branch of a run-time choice) is its own trace: a SavedModel would
    hold one copy of a table per use. Inside, `traced_constant` makes each table once,
    eagerly, and every trace captures that tensor, which `tf.saved_model.save` writes
    once, as a constant the loaded functions share (loadable by `tf.saved_model.load`
    alone). A non-trainable `tf.Variable` is stored once too, but would be a weight to
    every tool that lists them. Only for SavedModels: a captured tensor is an unfeedable
    ONNX input, and `save_onnx` (`dedupe_constants`) and the LiteRT converter merge copies.
    """
    return _while_tracing("stored", {})


def traced_constant(owner, key: tuple, array: Callable[[], np.ndarray]) -> tf.Tensor:
    """A constant of `array()` in the graph being traced, for `owner`'s rows named `key`.

    A node of its own, or inside `tables_stored_once` one eager tensor per `(owner, key)`
    that every trace captures.
    """
    stored = getattr(_tracing, "stored", None)
    if stored is None:
        return tf.constant(array())
    entry = stored.get((id(owner), key))
    if entry is None:
        with tf.init_scope():
            # The owner is kept with its tensor, so that its id is not reused meanwhile.
            entry = stored[(id(owner), key)] = (owner, tf.constant(array()))
    return entry[1]


def shared_while_stored(owner, key: tuple, compute: Callable) -> Callable:
    """`compute`, or inside `tables_stored_once` one `tf.function` of it per `(owner, key)`.

    What every layer of a model computes alike (the rows of a run, from the length and
    the start) is then one function of the SavedModel that each layer calls, not one copy
    of its graph per layer. `compute` must depend on its arguments and `owner` alone.
    """
    stored = getattr(_tracing, "stored", None)
    if stored is None:
        return compute
    entry = stored.get((id(owner), "function", key))
    if entry is None:

        def shared(*args):
            return compute(*args)

        shared.__name__ = "posenc_" + "_".join(str(part) for part in key)  # its name in the file
        function = tf.function(shared, autograph=False)
        entry = stored[(id(owner), "function", key)] = (owner, function)
    return entry[1]


def positions_bounded(bound: int | None) -> contextlib.AbstractContextManager[None]:
    """While an export is traced for positions below `bound` only (None: no bound).

    Position tables read it (`position_bound`) to hold only the rows below it, and treat
    positions at or past it as bad: an assertion in a SavedModel, NaN rows in ONNX and
    LiteRT. Outside, nothing is bounded.
    """
    return _while_tracing("bound", bound)


def position_bound() -> int | None:
    """The bound of the export being traced (`positions_bounded`), or None."""
    if tf.executing_eagerly():
        return None
    return getattr(_tracing, "bound", None)


# --------------------------------------------------------------------------------------
# Bad positions in graphs that cannot raise


def tracing_for_a_converter() -> contextlib.AbstractContextManager[None]:
    """While a graph is traced for a converter that drops assertions (tf2onnx, TFLite).

    Graphs traced inside poison the rows of bad positions (`tf_backend.nan_unless`), as graphs
    compiled by XLA always do. Elsewhere TensorFlow runs the assertions, which raise.
    """
    return _while_tracing("for_converter", True)


def assertions_dropped() -> bool:
    """Whether the graph being traced loses its assertions (XLA, or a converter)."""
    return getattr(_tracing, "for_converter", False) or in_xla_context()
