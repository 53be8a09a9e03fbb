"""The encoder layers' calls on JAX and PyTorch (`keras.ops`), beside their TensorFlow ones.

Each layer's `call` comes here when Keras does not run on TensorFlow: the same checks, the
same host tables (`keras_posenc._keras_rows`) and the same math (`inputs + rows` rounded
once; `x·C + swap(x)·S` in float32 or wider).
"""

from __future__ import annotations

from keras import ops

from keras_posenc import _keras_ops as kops
from keras_posenc import layouts
from keras_posenc._keras_rows import position_rows
from keras_posenc.frequencies import MAX_POSITIONS

_ROTARY_HINT = "the rotation is exact only below that."


def sinusoidal_call(layer, inputs, positions, start_index):
    """`SinusoidalPositionalEncoding.call` on this backend."""
    kops.checked_input(layer, inputs, 3, {-1: layer._table_width})
    if layer.axes > 1 and positions is None:
        raise ValueError(
            f"A {layer.axes}-axis encoding needs positions of shape (sequence, {layer.axes}) "
            f"or (batch, sequence, {layer.axes}), one coordinate per axis; for a patch grid "
            "use positions=keras_posenc.grid_positions(height, width)."
        )
    return position_rows(
        layer._table,
        lambda sin, cos: (layouts.encoding(layer.layout, sin, cos, layer.axes, ops),),
        inputs.shape[1],
        positions,
        start_index,
        limit=MAX_POSITIONS,
        limit_hint="the encoding is exact only below that.",
        batch=inputs.shape[0],
        axes=layer.axes,
        traced=kops.is_traced(inputs),
        combine=lambda encoding: kops.add_rounded_once(inputs, encoding),
    )


def learned_call(layer, table, inputs, positions, start_index, limit_hint: str):
    """`LearnedPositionalEmbedding.call` on this backend (`table`: its `_VariableRows`)."""
    kops.checked_input(layer, inputs, 3, {-1: layer.embeddings.shape[1]})
    return position_rows(
        table,
        None,
        inputs.shape[1],
        positions,
        start_index,
        limit=layer.max_length,
        limit_hint=limit_hint,
        batch=inputs.shape[0],
        traced=kops.is_traced(inputs),
        combine=lambda embedding: kops.add_rounded_once(inputs, embedding),
    )


def rotate_together(layer, tensors, positions, start_index, mask) -> tuple:
    """`RotaryEmbedding.rotate_together` on this backend."""
    for x in tensors:
        kops.checked_input(layer, x, layer._built_rank, {layer._feature_axis: layer._head_dim})
    if layer.axes_dims is not None and positions is None and not layer.positions_from_mask:
        raise ValueError(
            f"Axial RoPE needs positions of shape (sequence, {layer._axes}) or (batch, "
            f"sequence, {layer._axes}), one coordinate per axis; for a patch grid use "
            "positions=keras_posenc.grid_positions(height, width)."
        )
    first = tensors[0]

    def rotate(cos_table, sin_table):
        return tuple(_rotate(layer, x, cos_table, sin_table) for x in tensors)

    # A concat swap does not keep its speed fused into the branches of a run-time choice
    # (as `_tf.rows_fuse_into_rotation`): the rows, far smaller than the input, come out.
    fuse = not any(kops.swap_by_concat(x) for x in tensors)
    rows = position_rows(
        layer._table,
        lambda sin, cos: layouts.channel_tables(layer.layout, sin, cos, ops),
        first.shape[layer._sequence_axis],
        positions,
        start_index,
        limit=MAX_POSITIONS,
        limit_hint=_ROTARY_HINT,
        mask=mask if layer.positions_from_mask else None,
        batch=first.shape[0],
        axes=layer._axes,
        traced=kops.is_traced(first),
        **({"combine": rotate} if fuse else {}),
    )
    return rows if fuse else rotate(*rows)


def _rotate(layer, inputs, cos_table, sin_table):
    rank = len(inputs.shape)
    table_axes = [0, layer._sequence_axis, layer._feature_axis][-len(cos_table.shape) :]
    if table_axes != list(range(rank - len(table_axes), rank)):
        shape = [1] * rank
        for table_axis, input_axis in enumerate(table_axes):
            shape[input_axis] = cos_table.shape[table_axis]
        cos_table, sin_table = ops.reshape(cos_table, shape), ops.reshape(sin_table, shape)
    wide = kops.accumulation_dtype(inputs.dtype)
    cos_table, sin_table = ops.cast(cos_table, wide), ops.cast(sin_table, wide)

    def rotate(x):
        x = ops.cast(x, wide)
        swapped = kops.swap_pairs(x, layer.layout, layer._feature_axis)
        return ops.cast(x * cos_table + swapped * sin_table, inputs.dtype)

    head_dim = inputs.shape[layer._feature_axis]
    if layer._rotary_dim == head_dim:
        return rotate(inputs)
    rotated, passed = ops.split(inputs, [layer._rotary_dim], layer._feature_axis)
    return ops.concatenate([rotate(rotated), passed], layer._feature_axis)
