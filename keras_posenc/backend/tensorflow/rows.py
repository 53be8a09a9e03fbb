"""What the encoder layers' rows need of TensorFlow: the few places it differs.

The rows are read once for every backend (`keras_posenc.tables.positions`, `rows`, `frequencies`,
`rope_scaling`, `axes`), in `keras.ops`. Where TensorFlow needs its own op to keep its
graphs (and their ONNX / LiteRT exports) as they are, or has something the other backends
have not (values known while tracing, graph assertions, XLA or not, an export's bound),
that code asks the backend's tricks module: this one (re-exported by
`keras_posenc.backend.tensorflow`), or `keras_posenc.backend.keras_ops` on JAX and PyTorch, which
has the same names. The benchmark
cases that justify a trick are named (`python -m benchmarks`, see docs/benchmarks.md).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import tensorflow as tf

from keras_posenc.backend.tensorflow.private import xla
from keras_posenc.backend.tensorflow.tracing import assertions_dropped, in_xla_context
from keras_posenc.tables.rows import as_rows

# --------------------------------------------------------------------------------------
# Checks, poison


def check(predicate: Callable, values: list, message: Callable, error=ValueError) -> list:
    """Raise `error(message(*values))` unless `predicate(*values)` holds for every element.

    With every value known (Python numbers, eager or constant tensors) the check runs now
    and its verdict is `[]`; otherwise it is a graph assertion, returned in a list so the
    caller can make the computation wait for it (`after`: a slice could otherwise fail
    first, with a message about the slice instead of the input). Converters and XLA drop
    assertions: callers also poison the rows (`validity`, `nan_unless`).
    """
    # tf.is_tensor is slow on Python numbers (a Protocol check): test for them first.
    known = [v if isinstance(v, (int, np.integer)) else tf.get_static_value(v) for v in values]
    if all(k is not None for k in known):
        if not np.all(predicate(*known)):
            raise error(message(*(np.asarray(k).tolist() for k in known)))
        return []
    values = [tf.convert_to_tensor(v) for v in values]
    tensors = [tf.cast(v, tf.int64) for v in values]
    # Shown as int32 where they are: an Assert whose data are all int32 or strings is one
    # op; with int64 data it is wrapped in a conditional (several ops a call in a graph).
    shown = [v if v.dtype == tf.int32 else t for v, t in zip(values, tensors, strict=True)]
    return [
        tf.debugging.Assert(
            tf.reduce_all(predicate(*tensors)),
            [message(*["(value below)"] * len(values)), *shown],
        )
    ]


def after(verdicts: Sequence[list], tensor):
    """`tensor`, computed only once the assertions of `verdicts` have passed."""
    if not any(verdicts):
        return tensor
    assertions = [assertion for verdict in verdicts for assertion in verdict]
    with tf.control_dependencies(assertions):
        return tf.identity(tensor)


def validity(verdicts: Sequence[list], condition: Callable):
    """What the rows are poisoned by (`nan_unless`) for checks whose verdicts these are:
    True where they ran now, else `condition()`, formed again in int32 from the values the
    graph goes on with (the assertions hold int64 casts of them)."""
    return condition() if any(verdicts) else True


def clamped_positions(positions: tf.Tensor, limit: int, verdicts: Sequence[list]):
    """`(positions, valid)` for int32 `positions` checked by `verdicts`: positions known
    while tracing as they are (valid); others clamped into `[0, limit)`, so that no runtime
    fails on the lookup, with `valid` formed from them for the graphs that poison."""
    del verdicts  # asserted: `valid` is formed again
    if tf.get_static_value(positions) is not None:
        return positions, True
    # One bad position poisons the whole call: no part of it is to be trusted.
    valid = (tf.reduce_min(positions) >= 0) & (tf.reduce_max(positions) < limit)
    return tf.clip_by_value(positions, 0, limit - 1), valid


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
# Rows of a table from a run-time start, and run-time choices


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


def int_array(values) -> np.ndarray | list:
    """`values` as an int32 numpy array when they are all Python ints, else unchanged.

    Given a Python list an eager op leaves TensorFlow's fast path for a slow conversion
    (benchmark case: eager tiny call); given a numpy array it stays on it.
    """
    if all(isinstance(v, (int, np.integer)) for v in values):
        return np.asarray(values, dtype=np.int32)
    return values


def smallest(x: tf.Tensor) -> tf.Tensor:
    """`tf.reduce_min`: eagerly `keras.ops.min` first asks whether `x` is empty (3 ops)."""
    return tf.reduce_min(x)


def largest(x: tf.Tensor) -> tf.Tensor:
    """`tf.reduce_max` (as `smallest`)."""
    return tf.reduce_max(x)


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
    unknown: Callable[[], tf.Tensor],
):
    """`combine(*if_true())` where `predicate` holds at run time, else `combine(*if_false())`.

    `unknown()` is any bool that XLA cannot fold to a constant (its value is not used),
    made first, before the branches.

    Under XLA `combine` runs inside each branch, so that XLA fuses the row lookup into
    it: rows returned by a conditional are written out whole and read back (benchmark
    case: sinusoidal 4096 x 1024, XLA, tensor start). The rows of `if_false` are computed
    from split tables and must not fuse into `combine`: XLA would compute them again for
    every batch row and head. A conditional is a fusion boundary (XLA:CPU expands its
    optimization-barrier op away before fusing), so they come out of one, written once.
    Outside XLA the cond returns the rows (by reference, no copy) and `combine` follows:
    converters such as tf2onnx cannot infer shapes inside the branches.
    """
    unknown = unknown()
    if in_xla_context():

        def computed_once():
            return tf.cond(unknown, if_false, if_false)

        return tf.cond(predicate, lambda: combine(*if_true()), lambda: combine(*computed_once()))
    return combine(*tf.cond(predicate, if_true, if_false))


def combined(rows: Callable, combine: Callable):
    """`combine` of the rows `rows(combine_inside)` gives, for a choice of table by the
    total length (`SwitchByLength`): here `combine` follows the choice, whose branches
    return the rows (`combine(*rows(as_rows))`)."""
    return combine(*rows(as_rows))


# --------------------------------------------------------------------------------------
# TensorFlow's own ops where `keras.ops` would change the graphs it exports


def as_positions(positions) -> tf.Tensor:
    """`positions` as a tensor: TensorFlow folds what it knows while tracing itself."""
    return tf.convert_to_tensor(positions)


def read(table) -> tf.Tensor:
    """A variable's value, read once as one tensor (a custom gradient under XLA takes no
    variable)."""
    return tf.convert_to_tensor(table)


def cond(predicate, if_true: Callable, if_false: Callable):
    """`tf.cond`: `keras.ops.cond` folds a predicate that TensorFlow can evaluate while
    tracing (`smart_cond`), which would change the graphs that hold it."""
    return tf.cond(predicate, if_true, if_false)


def equal(x, y):
    """`tf.equal`, as the exported graphs hold it (see `maximum`)."""
    return tf.equal(x, y)


def maximum(x, y):
    """`tf.maximum`, as the exported graphs hold it (`keras.ops.maximum` names the constant
    of a Python number `Const`, not `Maximum/y`, and makes no op of two numbers)."""
    return tf.maximum(x, y)


def total_length_of_run(start, length, positions) -> tf.Tensor:
    """The total length of the run `positions` (`start .. start + length - 1`): `start +
    length`, no reduction over the positions."""
    del positions
    return start + length
