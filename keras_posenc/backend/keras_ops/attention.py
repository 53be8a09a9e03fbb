"""What the attention layers' shared call needs of JAX and PyTorch.

`keras_posenc.layers.kv_cache`, `attend` and `rotary_attention_call` are written once, in
`keras.ops`; they ask the backend's tricks module for what differs, under the names
`keras_posenc.backend.tensorflow.attention` gives TensorFlow's answers. Shapes are static here; a
value is known unless traced.
"""

from __future__ import annotations

from keras import ops


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
    """A padded row's positions (`keras_posenc.tables.positions.positions_from_mask`): `start_index
    + cumsum(mask) - 1`, clamped at `start_index`. A bad start known now raises; a traced
    one gives negative positions, which the rotation then poisons."""
    from keras_posenc.tables.positions import positions_from_mask

    return positions_from_mask(mask, start_index)
