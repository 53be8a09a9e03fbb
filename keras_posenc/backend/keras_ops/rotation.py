"""What RoPE's rotation and the additive encodings need of JAX and PyTorch.

The names of `keras_posenc.backend.tensorflow.rotation`: the dtype the layers combine in (float32 or
wider, rounded once), the channel swap's form, and what TensorFlow's graphs need that
these do not (a name scope for the ONNX passes, static shapes for the converters).
"""

from __future__ import annotations

import contextlib

import keras
import numpy as np
from keras import ops

from keras_posenc.tables import layouts


def accumulation_dtype(dtype) -> str:
    """float32 for float16 / bfloat16, else the dtype itself (as
    `tf_backend.accumulation_dtype`)."""
    dtype = keras.backend.standardize_dtype(dtype)
    return "float32" if dtype in ("float16", "bfloat16") else dtype


def add_rounded_once(inputs, rows):
    """`inputs + rows` in the accumulation dtype, cast back once."""
    wide = accumulation_dtype(inputs.dtype)
    return ops.cast(ops.cast(inputs, wide) + ops.cast(rows, wide), inputs.dtype)


def cast(x, dtype):
    return ops.cast(x, dtype)


def reshape(x, shape):
    return ops.reshape(x, shape)


# As `tf_backend.XLA_CPU_CONCAT_SWAP_BYTES`: under XLA:CPU a concat of the pairs' halves beats a
# flip while input and output stay in the last-level cache, and loses beyond it
# (`python -m benchmarks --backend jax`: rotary 8x512x8x64 and 1x4096x32x128).
XLA_CPU_CONCAT_SWAP_BYTES = 8 * 2**20


def _swap_by_concat(x) -> bool:
    """Whether the swap of `x` is a concat of the halves (JAX on CPU, small inputs)."""
    if keras.backend.backend() != "jax":
        return False
    import jax

    if not all(isinstance(size, int) for size in x.shape):
        # A symbolic size (`jax.export`, as Keras's `model.export` traces): the flip form,
        # which serves every size.
        return False
    size = int(np.prod(x.shape)) * np.dtype(keras.backend.standardize_dtype(x.dtype)).itemsize
    return jax.default_backend() == "cpu" and size <= XLA_CPU_CONCAT_SWAP_BYTES


def swap_form(x) -> str:
    """How to exchange the two channels of every pair of `x`: `"concat"` of the halves
    (`_swap_by_concat`), else `"reverse"` (a reshape and a flip)."""
    return "concat" if _swap_by_concat(x) else "reverse"


def rows_fuse_into_rotation(form: str) -> bool:
    """Whether a rotation runs inside the branches that choose its rows at run time: a
    concat swap does not keep its speed there (as `tf_backend.rows_fuse_into_rotation`): the
    rows, far smaller than the input, come out."""
    return form != "concat"


def swap_pairs(x, layout: str, axis: int, form: str):
    """Exchange the two channels of every pair (`layout`) along `axis`: a reshape and a
    flip, or (`"concat"`) a concat of the two halves."""
    shape = tuple(x.shape)
    axis %= len(shape)
    pair_shape, pair_axis = layouts.pair_view(layout, shape[axis])
    paired = ops.reshape(x, shape[:axis] + tuple(pair_shape) + shape[axis + 1 :])
    if form == "concat":
        first, second = ops.split(paired, 2, axis=axis + pair_axis)
        swapped = ops.concatenate([second, first], axis=axis + pair_axis)
    else:
        swapped = ops.flip(paired, axis=axis + pair_axis)
    return ops.reshape(swapped, shape)


def split_channels(x, size: int, axis: int) -> tuple:
    """`x` split along `axis` into its first `size` channels and the rest."""
    return tuple(ops.split(x, [size], axis))


def rotation_name_scope(name: str):
    """No name scope: the ONNX passes read TensorFlow's graphs."""
    del name
    return contextlib.nullcontext()


def keep_static_shape(outputs, shape) -> None:
    """Nothing to do: shapes are static here."""
    del outputs, shape
