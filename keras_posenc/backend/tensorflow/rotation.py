"""What RoPE's rotation and the additive encodings need of TensorFlow.

`RotaryEmbedding`, `SinusoidalPositionalEncoding` and `LearnedPositionalEmbedding` are
written once for every backend; the dtype they combine in, the channel swap's form and
the static shapes of their outputs are TensorFlow's here (re-exported by
`keras_posenc.backend.tensorflow`) and JAX's / PyTorch's in
`keras_posenc.backend.keras_ops.rotation`.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from keras_posenc.backend.tensorflow.rows import int_array
from keras_posenc.backend.tensorflow.tracing import in_xla_context, xla_on_cpu
from keras_posenc.tables import layouts

# --------------------------------------------------------------------------------------
# Dtypes


def accumulation_dtype(dtype) -> tf.DType:
    """The dtype a layer combines its input with its tables in: float32 or wider.

    float16 / bfloat16 inputs are widened so that the result is rounded once, when it is
    cast back to the input dtype; float32 and float64 inputs are used as they are.
    """
    dtype = tf.as_dtype(dtype)
    return dtype if dtype.size >= 4 else tf.float32


def add_rounded_once(inputs: tf.Tensor, rows: tf.Tensor) -> tf.Tensor:
    """`inputs + rows` in `accumulation_dtype(inputs.dtype)`, cast back: rounded once."""
    wide = accumulation_dtype(inputs.dtype)
    return tf.cast(tf.cast(inputs, wide) + tf.cast(rows, wide), inputs.dtype)


def cast(x, dtype) -> tf.Tensor:
    """`tf.cast`: eagerly `keras.ops.cast` adds its own dtype handling to every call
    (docs/backends.md has the cost)."""
    return tf.cast(x, dtype)


def reshape(x, shape) -> tf.Tensor:
    """`tf.reshape`: eagerly `keras.ops.reshape` checks the shape at every call
    (docs/backends.md has the cost)."""
    return tf.reshape(x, shape)


# --------------------------------------------------------------------------------------
# The channel swap of RoPE

# Under XLA:CPU a concat of the pairs' halves (fused into the rotation) beats a gather by
# a constant permutation while input and output stay in the last-level cache, and loses
# beyond it (benchmark cases: rotary 8x512x8x64 and 4096x32x128 under XLA).
XLA_CPU_CONCAT_SWAP_BYTES = 8 * 2**20


def swap_form(x: tf.Tensor) -> str:
    """How to exchange the two channels of every pair of `x` in the graph being traced.

    The one place the form is chosen (`RotaryEmbedding` follows it, including where its
    rows fuse). `"reverse"` (a reshape and a reverse) outside XLA, where a gather is
    several times slower (benchmark: rotary, tf.function rows). Under XLA a gather by a
    constant permutation, except on XLA:CPU up to `XLA_CPU_CONCAT_SWAP_BYTES`, where a
    concat of the halves is faster (the only device where the forms were measured).
    """
    if not in_xla_context():
        return "reverse"
    size = x.shape.num_elements()
    if (
        xla_on_cpu()
        and size is not None
        and size * accumulation_dtype(x.dtype).size <= XLA_CPU_CONCAT_SWAP_BYTES
    ):
        return "concat"
    return "gather"


def rows_fuse_into_rotation(form: str) -> bool:
    """Whether a rotation should run inside the branches that choose its rows at run time.

    Fused there, the gather keeps its speed while the concat runs at twice the floor
    (benchmark case: rotary 8x512x8x64, XLA, tensor start); the rows are (batch x heads)
    times smaller than the input, so for the concat they come out whole and it follows.
    """
    return form != "concat"


def swap_pairs(x: tf.Tensor, layout: str, axis: int, form: str) -> tf.Tensor:
    """Exchange the two channels of every pair (`layout`) along `axis` of `x`, in `form`."""
    axis = axis % x.shape.rank
    width = x.shape[axis]
    pair_shape, pair_axis = layouts.pair_view(layout, width)
    if form == "gather":
        permutation = np.flip(np.arange(width).reshape(pair_shape), pair_axis).reshape(-1)
        return tf.gather(x, permutation.astype(np.int32), axis=axis)
    if x.shape.is_fully_defined():
        shape = x.shape.as_list()
        paired_shape = int_array(shape[:axis] + pair_shape + shape[axis + 1 :])
        shape = int_array(shape)
    else:
        shape = tf.shape(x)
        paired_shape = tf.concat([shape[:axis], pair_shape, shape[axis + 1 :]], 0)
    paired = tf.reshape(x, paired_shape)
    if form == "concat":
        first, second = tf.split(paired, 2, axis=axis + pair_axis)
        swapped = tf.concat([second, first], axis + pair_axis)
    else:
        swapped = tf.reverse(paired, int_array([axis + pair_axis]))
    return tf.reshape(swapped, shape)


def split_channels(x: tf.Tensor, size: int, axis: int) -> tuple[tf.Tensor, tf.Tensor]:
    """`x` split along `axis` into its first `size` channels and the rest (`tf.split` by
    sizes keeps both parts' widths static; `keras.ops.split` computes them at run time)."""
    return tuple(tf.split(x, [size, x.shape[axis] - size], axis))


def rotation_name_scope(name: str):
    """The name scope a rotation's ops carry, for the ONNX passes to find (`rotation_scope`)."""
    return tf.name_scope(name)


def keep_static_shape(outputs: tf.Tensor, shape) -> None:
    """Give `outputs` the input's static `shape`: the rows' own shapes are not always static
    (rows chosen at run time), and a layer after this one (an Einsum) then converts to
    LiteRT without Flex ops."""
    outputs.set_shape(shape)
