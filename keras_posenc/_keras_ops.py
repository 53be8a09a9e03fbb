"""The encoder layers on JAX and PyTorch: their rows and their math in `keras.ops`.

TensorFlow runs the layers through `keras_posenc.rows` / `positions` and the tricks of
`keras_posenc._tf`; every other backend runs them here. The tables are the same host
arrays (the shared float64 frequency table rounded once: `PositionTable.cached` and
`FrequencyTable._split_tables`), read the same way:

- a run inside the cached rows is a slice of them (a host slice, so under `jax.jit` a
  constant of just those rows), past them the two-table split, and the exact host rows
  where the run is static while `jax.jit` traces (as TensorFlow embeds them in a graph);
- explicit positions take the split tables; dynamic NTK's frequencies are made per call
  and rotated by the fixed-point `exact_sin_cos` (int32 wrapping on JAX, int64 on torch);
- a start or positions known now are checked now, with TensorFlow's messages; traced ones
  (`jax.jit`, or torch's meta tensors while Keras infers shapes) are clamped into the
  tables and the rows poisoned with NaN when they are bad, as under XLA in TensorFlow.
"""

from __future__ import annotations

import math
import weakref

import keras
import numpy as np
from keras import ops

from keras_posenc.frequencies import CACHED_POSITIONS, MAX_POSITIONS
from keras_posenc.positions import _run_message

_TURN = 2**31  # one turn, as in `frequencies.exact_sin_cos`


def uses_tensorflow() -> bool:
    """Whether Keras runs on TensorFlow (the layers then take their TensorFlow paths)."""
    return keras.backend.backend() == "tensorflow"


# --------------------------------------------------------------------------------------
# Values known now, checks, poison


def known(value):
    """`value` as a Python int or numpy array when it is known now, else None (traced)."""
    if isinstance(value, (bool, np.bool_, int, np.integer)):
        return value
    if isinstance(value, np.ndarray):
        return value
    if is_traced(value):
        return None
    return ops.convert_to_numpy(value)


def is_traced(x) -> bool:
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


def check(predicate, values: list, message, error=ValueError):
    """`True` after raising `error(message(...))` unless `predicate` holds, where every value
    is known now; else the bool tensor of `predicate` (which the caller poisons by)."""
    values_now = [known(v) for v in values]
    if all(v is not None for v in values_now):
        if not np.all(predicate(*values_now)):
            raise error(message(*(np.asarray(v).tolist() for v in values_now)))
        return True
    return ops.all(predicate(*values))


def both(a, b):
    """The conjunction of two validities (`True` or bool tensors)."""
    if a is True:
        return b
    return a if b is True else ops.logical_and(a, b)


def nan_unless(rows, valid) -> tuple:
    """`rows`, NaN in place of them where `valid` (a traced bool) is False."""
    if valid is True:
        return tuple(rows)
    return tuple(ops.where(valid, row, ops.cast(float("nan"), row.dtype)) for row in rows)


def dtype_name(x) -> str:
    return keras.backend.standardize_dtype(x.dtype)


def accumulation_dtype(dtype) -> str:
    """float32 for float16 / bfloat16, else the dtype itself (as `_tf.accumulation_dtype`)."""
    dtype = keras.backend.standardize_dtype(dtype)
    return "float32" if dtype in ("float16", "bfloat16") else dtype


def checked_input(layer, inputs, rank: int, sizes: dict) -> None:
    """`_checks.checked_call_input` for this backend's tensors (shapes are tuples here)."""
    name = type(layer).__name__
    dtype = dtype_name(inputs)
    if "float" not in dtype:
        raise TypeError(
            f"{name} needs a floating-point input, got dtype {dtype}. Cast it first "
            "(for token ids, embed them: keras.layers.Embedding)."
        )
    shape = tuple(inputs.shape)
    if len(shape) != rank:
        raise ValueError(
            f"{name} was built for inputs of rank {rank}, got shape {shape}. Use a new "
            "layer for inputs of another rank."
        )
    for axis, size in sizes.items():
        if shape[axis] is not None and size is not None and shape[axis] != size:
            raise ValueError(
                f"{name} was built for inputs with {size} channels on axis {axis}, got shape "
                f"{shape}. Use a new layer for inputs of another size."
            )


# --------------------------------------------------------------------------------------
# Positions: a start, explicit positions, a padding mask


def start_of(start_index):
    """`start_index` as a Python int when known now, else a scalar int32 tensor."""
    if isinstance(start_index, (bool, np.bool_)):
        raise TypeError(f"start_index must be an integer, got the bool {start_index!r}.")
    if isinstance(start_index, (int, np.integer)):
        return int(start_index)
    start_index = ops.convert_to_tensor(start_index)
    if "int" not in dtype_name(start_index):
        raise TypeError(
            f"start_index must be an int32 or int64 scalar, got dtype {dtype_name(start_index)}. "
            "Cast it with keras.ops.cast(start_index, 'int32')."
        )
    if len(start_index.shape) != 0:
        raise ValueError(
            f"start_index must be a scalar, got shape {tuple(start_index.shape)}. "
            "For a different start per sequence, pass `positions` of shape (batch, sequence)."
        )
    value = known(start_index)
    if value is not None:
        return int(value)
    return int32_saturated(start_index)


def int32_saturated(x):
    """Integers as int32, clipped (2^32 + 5 must stay out of range, not become 5)."""
    if dtype_name(x) in ("int64", "uint32", "uint64"):
        bounds = np.iinfo(np.int32)
        x = ops.clip(x, int(bounds.min), int(bounds.max))
    return ops.cast(x, "int32")


def checked_positions(positions, length: int, batch: int, axes: int, limit: int, hint: str):
    """`(positions as clamped int32, valid)`: checked as `positions.checked_positions` and
    `position_rows` check them; `valid` is True, or a traced bool for the poison."""
    values = known(positions)
    if values is not None:
        positions = np.asarray(values)
    else:
        positions = ops.convert_to_tensor(positions)
    dtype = str(positions.dtype) if isinstance(positions, np.ndarray) else dtype_name(positions)
    if "int" not in dtype or dtype == "bool":
        raise TypeError(
            f"positions must be integers (int32 or int64), got dtype {dtype}. "
            "Cast them with keras.ops.cast(positions, 'int32')."
        )
    shape = tuple(positions.shape)
    if axes == 1 and len(shape) not in (1, 2):
        raise ValueError(
            f"positions must have shape (sequence,) or (batch, sequence), got shape {shape}."
        )
    if axes > 1 and (len(shape) not in (2, 3) or shape[-1] != axes):
        raise ValueError(
            f"positions of a {axes}-axis encoding must have shape (sequence, {axes}) or "
            f"(batch, sequence, {axes}): one coordinate per axis; got shape {shape}. "
            "keras_posenc.grid_positions makes them for a patch grid."
        )
    steps = shape[-1 if axes == 1 else -2]
    if steps != length:
        raise ValueError(
            f"positions cover {steps} steps but the input sequence has {length}; give one "
            "position per step."
        )
    if len(shape) == (2 if axes == 1 else 3) and batch is not None and shape[0] != batch:
        raise ValueError(
            f"positions have a batch of {shape[0]} but the input has {batch}; give "
            "positions of shape (sequence,) for all rows or (batch, sequence) per row."
        )
    valid = check(
        lambda smallest: smallest >= 0,
        [ops.min(positions) if values is None else positions.min()],
        lambda smallest: f"positions must be >= 0 (they count from 0); the smallest is {smallest}.",
    )
    valid = both(
        valid,
        check(
            lambda largest: largest < limit,
            [ops.max(positions) if values is None else positions.max()],
            lambda largest: (
                f"the largest position is {largest} but positions must be below {limit}; {hint}"
            ),
        ),
    )
    return ops.clip(int32_saturated(ops.convert_to_tensor(positions)), 0, limit - 1), valid


def positions_from_mask(mask, start_index, axes: int):
    """`start_index + cumsum(mask) - 1`, clamped at `start_index` (`positions_from_mask`)."""
    mask = ops.convert_to_tensor(mask)
    if len(mask.shape) != 2:
        raise ValueError(
            f"A padding mask must have shape (batch, sequence), got {tuple(mask.shape)}."
        )
    start = start_of(start_index)
    valid = check(
        lambda s: s >= 0,
        [start],
        lambda s: f"start_index must be >= 0, got {s}. Positions count from 0.",
    )
    counted = ops.maximum(ops.cumsum(ops.cast(mask, "int32"), axis=1) - 1, 0) + start
    if axes > 1:  # padding: tokens of text, at the same position on every axis
        counted = ops.stack([counted] * axes, -1)
    return counted, valid


def checked_run(start_index, length: int, limit: int, hint: str):
    """`(start, valid)` for a run of `length` from `start_index` (as `position_rows` checks)."""
    start = start_of(start_index)
    if is_symbolic(length):
        return _checked_symbolic_run(start, length, limit, hint)
    if not isinstance(start, int) and length > limit:
        raise ValueError(
            f"the sequence has {length} steps but positions must stay within {limit}; {hint}"
        )
    valid = check(
        lambda first, steps: (first >= 0) & (first <= limit - steps),
        [start, length],
        lambda first, steps: _run_message(first, steps, limit, hint),
    )
    return start, valid


def _checked_symbolic_run(start, length, limit: int, hint: str):
    """`checked_run` for a symbolic `length` (`is_symbolic`): a start known now is checked
    now as far as it can be (>= 0 and below `limit`, whatever the length), the end of the
    run at run time (its rows poisoned). The start comes back as an int32 tensor: a run of
    a symbolic length is chosen at run time whatever its start."""
    if isinstance(start, int):
        check(
            lambda first: (first >= 0) & (first < limit),
            [start],
            lambda first: _run_message(first, None, limit, hint),
        )
    start = ops.convert_to_tensor(start, "int32")
    steps = ops.convert_to_tensor(length, "int32")
    return start, (start >= 0) & (start <= limit - steps)


# --------------------------------------------------------------------------------------
# sin/cos from the host tables


# Host tables as this backend's tensors, made once per table, for calls that are not traced
# (eager torch and JAX): a numpy table given to an op is copied to the device at every call
# (on a GPU, milliseconds for the split tables: benchmarks/gpu.sh, docs/gpu.md).
_eager_tensors: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def eager_tensors(owner, arrays) -> tuple:
    """`arrays`, host tables of `owner`, as tensors of this backend, made once per owner."""
    if owner not in _eager_tensors:
        _eager_tensors[owner] = tuple(ops.convert_to_tensor(a) for a in arrays)
    return _eager_tensors[owner]


def split_sin_cos(frequencies, positions):
    """`frequencies.sin_cos` here: the two-table split of `frequencies.lookup_sin_cos`."""
    tables = tuple(t.array for t in frequencies._split_tables)
    if not is_traced(positions):  # traced, the numpy tables become constants of the trace
        tables = eager_tensors(frequencies, tables)
    fine_sin, fine_cos, coarse_sin, coarse_cos = tables
    positions = ops.cast(positions, "int32")
    coarse = positions // CACHED_POSITIONS
    fine = positions - coarse * CACHED_POSITIONS
    sin_a = ops.take(coarse_sin, coarse, axis=0)
    cos_a = ops.take(coarse_cos, coarse, axis=0)
    sin_b = ops.take(fine_sin, fine, axis=0)
    cos_b = ops.take(fine_cos, fine, axis=0)
    return sin_a * cos_b + cos_a * sin_b, cos_a * cos_b - sin_a * sin_b


# Per frequency table, the host arrays `run_sin_cos` slices: the fine rows twice over (a
# run's fine rows then never wrap) and the coarse rows with one more (the next coarse row
# of the last one is never used, but must exist for a slice of two).
_run_tables: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def run_sin_cos(frequencies, start, length: int):
    """`split_sin_cos` of the run `start .. start + length - 1` by slices, for a traced
    `start` and `length <= CACHED_POSITIONS`: the same operands and arithmetic (so the
    same values), without gathers, which XLA:CPU runs far slower than slices.

    `start` is clamped into the tables; the caller poisons the rows of a bad run.
    """
    if frequencies not in _run_tables:
        fine_sin, fine_cos, coarse_sin, coarse_cos = (t.array for t in frequencies._split_tables)
        _run_tables[frequencies] = (
            np.concatenate([fine_sin, fine_sin]),
            np.concatenate([fine_cos, fine_cos]),
            np.concatenate([coarse_sin, coarse_sin[-1:]]),
            np.concatenate([coarse_cos, coarse_cos[-1:]]),
        )
    fine_sin, fine_cos, coarse_sin, coarse_cos = _run_tables[frequencies]
    width = fine_sin.shape[1]
    start = ops.clip(start, 0, MAX_POSITIONS - length)
    coarse = start // CACHED_POSITIONS
    fine = start - coarse * CACHED_POSITIONS
    sin_b = ops.slice(fine_sin, (fine, 0), (length, width))
    cos_b = ops.slice(fine_cos, (fine, 0), (length, width))
    # Rows past the end of the fine rows take the next coarse row.
    carried = ops.expand_dims(ops.arange(length, dtype="int32") >= CACHED_POSITIONS - fine, -1)
    two_sin = ops.slice(coarse_sin, (coarse, 0), (2, width))
    two_cos = ops.slice(coarse_cos, (coarse, 0), (2, width))
    sin_a = ops.where(carried, two_sin[1:], two_sin[:1])
    cos_a = ops.where(carried, two_cos[1:], two_cos[:1])
    return sin_a * cos_b + cos_a * sin_b, cos_a * cos_b - sin_a * sin_b


def _split_halves(x):
    scaled = x * 4097.0
    high = scaled - (scaled - x)
    return high, x - high


def exact_sin_cos(positions, turns):
    """`frequencies.exact_sin_cos` here: the same fixed-point sum, so the same angles.

    JAX has no int64 by default: its sum is int32, which wraps modulo 2^32; a turn being
    2^31, the wrapped sum reduces to the same fraction of a turn (a bit mask, not floormod).
    """
    wide = "int64" if keras.backend.backend() == "torch" else "int32"
    turns_high, turns_low = _split_halves(ops.cast(turns, "float32"))
    positions = ops.expand_dims(ops.cast(positions, "int32"), -1)
    position_low = positions % 4096
    position_high = ops.cast(positions - position_low, "float32")
    position_low = ops.cast(position_low, "float32")
    fixed = ops.zeros((), wide)
    for position_part in (position_high, position_low):
        for turns_part in (turns_high, turns_low):
            product = position_part * turns_part
            fraction = product - ops.round(product)
            fixed = fixed + ops.cast(ops.round(fraction * float(_TURN)), wide)
    half = _TURN // 2
    wrapped = ops.bitwise_and(fixed + half, _TURN - 1) - half
    angle = ops.cast(wrapped, "float32") * np.float32(2.0 * np.pi / _TURN)
    return ops.sin(angle), ops.cos(angle)


def dynamic_turns(total_length, omega: np.ndarray, factor: float, max_positions: int):
    """`rope_scaling.dynamic_turns` here (float32, as TensorFlow forms it)."""
    dim = 2 * len(omega)
    exponents = (np.arange(0, dim, 2, dtype=np.float64) / (dim - 2)).astype(np.float32)
    length = ops.maximum(ops.cast(total_length, "float32"), float(max_positions))
    growth = factor * length / float(max_positions) - (factor - 1.0)
    correction = ops.exp(ops.convert_to_tensor(-exponents) * ops.log(growth))
    return ops.convert_to_tensor((omega / (2 * math.pi)).astype(np.float32)) * correction


# --------------------------------------------------------------------------------------
# The channel swap of RoPE (the layouts themselves: `keras_posenc.layouts`)


# As `_tf.XLA_CPU_CONCAT_SWAP_BYTES`: under XLA:CPU a concat of the pairs' halves beats a
# flip while input and output stay in the last-level cache, and loses beyond it
# (`python -m benchmarks --backend jax`: rotary 8x512x8x64 and 1x4096x32x128).
XLA_CPU_CONCAT_SWAP_BYTES = 8 * 2**20


def swap_by_concat(x) -> bool:
    """Whether `swap_pairs` takes the concat form for `x` (JAX on CPU, small inputs)."""
    if keras.backend.backend() != "jax":
        return False
    import jax

    if not all(isinstance(size, int) for size in x.shape):
        # A symbolic size (`jax.export`, as Keras's `model.export` traces): the flip form,
        # which serves every size.
        return False
    size = int(np.prod(x.shape)) * np.dtype(dtype_name(x)).itemsize
    return jax.default_backend() == "cpu" and size <= XLA_CPU_CONCAT_SWAP_BYTES


def swap_pairs(x, layout: str, axis: int):
    """Exchange the two channels of every pair along `axis`: a reshape and a flip, or
    (`swap_by_concat`) a concat of the two halves."""
    shape = tuple(x.shape)
    axis %= len(shape)
    half = shape[axis] // 2
    pair_shape, pair_axis = ([2, half], 0) if layout == "half" else ([half, 2], 1)
    paired = ops.reshape(x, shape[:axis] + tuple(pair_shape) + shape[axis + 1 :])
    if swap_by_concat(x):
        first, second = ops.split(paired, 2, axis=axis + pair_axis)
        swapped = ops.concatenate([second, first], axis=axis + pair_axis)
    else:
        swapped = ops.flip(paired, axis=axis + pair_axis)
    return ops.reshape(swapped, shape)


def add_rounded_once(inputs, rows):
    """`inputs + rows` in the accumulation dtype, cast back once."""
    wide = accumulation_dtype(inputs.dtype)
    return ops.cast(ops.cast(inputs, wide) + ops.cast(rows, wide), inputs.dtype)


# --------------------------------------------------------------------------------------
# The attention layers' shared call (`keras_posenc._kv_cache`, `_attend`,
# `_rotary_attention`): what it asks of this backend, under the names `keras_posenc._tf`
# gives TensorFlow's answers. Shapes are static here; a value is known unless traced.


def static_value(value):
    """`value` as a Python int or numpy array when it is known now, else None (traced)."""
    return known(value)


def asserted(condition, message: list):
    """`condition` itself: no graph to assert in. A value known now was checked (and
    raised) already; a traced one makes the outputs NaN through `condition`."""
    del message
    return condition


def run_time_size(x, axis: int):
    """The size of `x` along `axis` (an int, or a symbolic size under `jax.export`)."""
    return ops.shape(x)[axis]


def run_time_shape(x):
    """The shape of `x` as an int32 vector."""
    return ops.convert_to_tensor(list(ops.shape(x)), "int32")


def take(x, indices, axis: int):
    return ops.take(x, indices, axis=axis)


def writes_in_place() -> bool:
    """A cache write is a dynamic update slice (`jax.lax.dynamic_update_slice`; torch
    writes the slots of a copy): one compilation serves a traced index."""
    return True


def positions_of_padding(mask, start_index=0):
    """A padded row's positions (`positions.positions_from_mask`): `start_index +
    cumsum(mask) - 1`, clamped at `start_index`. A bad start known now raises; a traced one
    gives negative positions, which the rotation then poisons."""
    positions, _ = positions_from_mask(mask, start_index, 1)
    return positions


def as_int32_positions(x):
    """Integers as int32, saturated (as `_tf.as_int32_positions`)."""
    return int32_saturated(x)


def widest_int() -> str:
    """int64, but int32 on JAX without x64 (which truncates int64 to it, with a warning)."""
    if keras.backend.backend() == "jax":
        import jax

        return "int64" if jax.config.jax_enable_x64 else "int32"
    return "int64"
