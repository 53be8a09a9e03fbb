"""Every TensorFlow / XLA / Keras specific the package relies on, each with why and when it can go.

The layers' math is plain (`inputs + rows`, `x·C + swap(x)·S`); what is here is how to make
TensorFlow run it at the memory floor in every mode; the few private APIs the package
touches are reached through `keras_posenc._tf.private` alone, and what the graph being
traced is for (XLA, an export's bound, a converter) is read from `keras_posenc._tf.tracing`
(both re-exported here). The benchmark cases that justify each trick are named
(`python -m benchmarks`, see docs/benchmarks.md); if a TensorFlow release makes a case fast
without the trick, the trick can go.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import tensorflow as tf

# A host array as a graph constant (defined without TensorFlow: every backend's tables hold it).
from keras_posenc._host_constant import HostConstant  # noqa: F401

# What the attention layers' shared call asks of this backend (see `attention`; the same
# names are in `keras_posenc._keras_ops` for JAX and PyTorch).
from keras_posenc._tf.attention import (  # noqa: F401
    asserted,
    positions_of_padding,
    run_time_shape,
    run_time_size,
    static_value,
    take,
    writes_in_place,
)

# The private TensorFlow and Keras APIs, each behind a named function (see `private`).
from keras_posenc._tf.private import (  # noqa: F401
    AutoTrackable,
    all_layers,
    attention_mask,
    attention_part,
    call_keyword_arguments,
    causal_mask,
    frozen_named_outputs,
    get_keras_mask,
    graph_functions,
    graph_in_xla_context,
    masked_softmax,
    replace_weight,
    saved_model_proto,
    set_keras_mask,
    tflite_schema,
    xla,
)

# The graph being traced: where it runs and what it is for (see `tracing`).
from keras_posenc._tf.tracing import (  # noqa: F401
    assertions_dropped,
    in_xla_context,
    position_bound,
    positions_bounded,
    shared_while_stored,
    tables_stored_once,
    traced_constant,
    tracing_for_a_converter,
    xla_on_cpu,
)

# --------------------------------------------------------------------------------------
# Constants


def int_array(values) -> np.ndarray | list:
    """`values` as an int32 numpy array when they are all Python ints, else unchanged.

    Given a Python list an eager op leaves TensorFlow's fast path for a slow conversion
    (benchmark case: eager tiny call); given a numpy array it stays on it.
    """
    if all(isinstance(v, (int, np.integer)) for v in values):
        return np.asarray(values, dtype=np.int32)
    return values


# --------------------------------------------------------------------------------------
# Rows of a table from a run-time start


def _xla_dynamic_rows(table: tf.Tensor, start: tf.Tensor, length: int) -> tf.Tensor:
    """Rows `start .. start + length - 1` by XLA's DynamicSlice, with its gradient.

    TensorFlow registers no gradient for XlaDynamicSlice; a learned table trained under
    XLA with a run-time start needs one: the upstream rows, put back where they came from.
    """
    begin = tf.stack([start, 0])

    @tf.custom_gradient
    def rows(table):
        def gradient(upstream):
            return xla.dynamic_update_slice(tf.zeros_like(table), upstream, begin)

        return xla.dynamic_slice(table, begin, [length, table.shape[1]]), gradient

    return rows(table)


def slice_rows(table: tf.Tensor, start, length) -> tf.Tensor:
    """Rows `start .. start + length - 1` of `table`; `start` an int or a scalar int32 tensor."""
    if not isinstance(start, (int, np.integer)) and in_xla_context():
        # tf.slice makes its start a compile-time constant under XLA: one compilation per
        # decoding step. XLA's own dynamic slice takes it at run time and fuses with its
        # consumer (a gather does too, but costs more from a large table: benchmark case
        # "XLA tensor start"). It needs a length known when tracing (XLA checks it against
        # the table even in an untaken branch); a length known only when compiling takes
        # the gather. Can go when tf.slice lowers to a dynamic slice under XLA.
        if isinstance(length, (int, np.integer)):
            return _xla_dynamic_rows(table, start, length)
        return tf.gather(table, tf.range(length) + start)
    if isinstance(start, (int, np.integer)) and isinstance(length, (int, np.integer)):
        # Outside XLA a slice of leading rows shares the table's memory: no copy.
        return tf.slice(table, int_array([start, 0]), int_array([length, -1]))
    # A slice of the first axis alone keeps the width static for every converter (a Slice
    # whose begin is packed from a tensor loses it, and the TFLite converter then needs a
    # Flex op for the einsum after it).
    return table[start : start + length]


def choose_at_run_time(
    predicate: tf.Tensor,
    if_true: Callable[[], Sequence[tf.Tensor]],
    if_false: Callable[[], Sequence[tf.Tensor]],
    combine: Callable,
    unknown: tf.Tensor,
):
    """`combine(*if_true())` where `predicate` holds at run time, else `combine(*if_false())`.

    `unknown` is any bool that XLA cannot fold to a constant (its value is not used).

    Under XLA `combine` runs inside each branch, so that XLA fuses the row lookup into
    it: rows returned by a conditional are written out whole and read back (benchmark
    case: sinusoidal 4096 x 1024, XLA, tensor start). The rows of `if_false` are computed
    from split tables and must not fuse into `combine`: XLA would compute them again for
    every batch row and head. A conditional is a fusion boundary (XLA:CPU expands its
    optimization-barrier op away before fusing), so they come out of one, written once.
    Outside XLA the cond returns the rows (by reference, no copy) and `combine` follows:
    converters such as tf2onnx cannot infer shapes inside the branches.
    """
    if in_xla_context():

        def computed_once():
            return tf.cond(unknown, if_false, if_false)

        return tf.cond(predicate, lambda: combine(*if_true()), lambda: combine(*computed_once()))
    return combine(*tf.cond(predicate, if_true, if_false))


# --------------------------------------------------------------------------------------
# Bad positions in graphs that cannot raise


def nan_unless(rows: Sequence[tf.Tensor], valid) -> tuple[tf.Tensor, ...]:
    """`rows`, with NaN in place of them when `valid` is False, where assertions are dropped.

    XLA compiles assertions away and converters (tf2onnx, the TFLite converter) drop them,
    and their slices and gathers clamp or wrap out-of-range indices, so a bad position would
    give a plausible wrong row; NaN makes it impossible to miss. Elsewhere (eagerly, in a
    `tf.function`, in a SavedModel) the assertions raise, and the rows are left alone: a
    `where` outside XLA is one more pass over them (benchmark case: sinusoidal 4096 x 1024,
    tf.function, tensor start). `valid` is a bool scalar; a Python bool True costs nothing.
    """
    if isinstance(valid, (bool, np.bool_)) or not assertions_dropped():
        return tuple(rows)
    return tuple(tf.where(valid, row, tf.constant(float("nan"), row.dtype)) for row in rows)


def as_int32_positions(positions: tf.Tensor) -> tf.Tensor:
    """Integer `positions` of any width as int32, saturated: 2^32 + 5 must stay out of range.

    Narrow types (int8, uint16, ...) widen exactly; wider ones clip to the int32 range,
    which every position limit lies within.
    """
    if positions.dtype == tf.int32:
        return positions
    if positions.dtype.size >= 4:
        bounds = np.iinfo(np.int32)
        clipped = tf.clip_by_value(
            tf.cast(positions, tf.int64), np.int64(bounds.min), np.int64(bounds.max)
        )
        return tf.cast(clipped, tf.int32)
    return tf.cast(positions, tf.int32)


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


def swap_pairs(x: tf.Tensor, pair_shape: list[int], pair_axis: int, axis: int, form: str):
    """Exchange the two channels of every pair along `axis` of `x`.

    The channels of `axis` viewed as `pair_shape` (`[2, D/2]` or `[D/2, 2]`) hold the two
    channels of each pair along `pair_axis` of that view.
    """
    axis = axis % x.shape.rank
    width = x.shape[axis]
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
