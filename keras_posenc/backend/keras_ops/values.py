"""Values on JAX and PyTorch: known now, or traced; sizes that are numbers, or symbolic."""

from __future__ import annotations

import keras
import numpy as np


def static_value(value):
    """`value` as a Python int or numpy array when it is known now, else None (traced). A
    symbolic size (`is_symbolic`) counts as known: JAX decides `==` between sizes."""
    if isinstance(value, (bool, np.bool_, int, np.integer)):
        return value
    if isinstance(value, np.ndarray) or is_symbolic(value):
        return value
    if is_traced(value):
        return None
    return keras.ops.convert_to_numpy(value)


def is_traced(x=None) -> bool:
    """Whether `x` is traced (`jax.jit`, torch's meta tensors), not a value known now."""
    if isinstance(x, keras.KerasTensor):
        return True
    backend = keras.backend.backend()
    if backend == "jax":
        return isinstance(x, _jax_tracer())
    if backend == "torch":
        import torch

        return isinstance(x, torch.Tensor) and x.device.type == "meta"
    return False


def is_symbolic(size) -> bool:
    """Whether `size`, a size from a shape, is a JAX dimension variable, not a number: the
    sizes `jax.export` traces with (Keras's `model.export` from JAX names every `None` of
    the inputs so; Keras's own shape inference on JAX uses one). Such a size takes part in
    shapes (`ops.arange`, reshapes) and, as `ops.convert_to_tensor(size, "int32")`, in
    arithmetic at run time, but no comparison with a number can be decided while tracing."""
    if isinstance(size, (int, np.integer)) or keras.backend.backend() != "jax":
        return False
    from jax import export

    return export.is_symbolic_dim(size)


def _jax_tracer() -> type:
    import jax

    # Public as jax.core.Tracer in jax 0.10; kept reachable should a release move it.
    tracer = getattr(jax.core, "Tracer", None)
    if tracer is None:
        from jax._src.core import Tracer as tracer
    return tracer
