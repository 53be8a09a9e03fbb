"""The layers on JAX and PyTorch: what they ask of the backend, in `keras.ops`.

Every layer is written once for every backend (`keras_posenc.positions`, `rows`,
`frequencies`, the layers themselves, the attention call); where the backends differ it
asks `keras_posenc._lazy.tricks()`: `keras_posenc._tf` on TensorFlow, this package on JAX
and PyTorch, under the same names, module by module:

- `values`: whether a value is known now or traced, and a size symbolic;
- `tracing`: the graph being traced (always XLA under JAX; no export bound, no stored
  tables, which are TensorFlow's);
- `rows`: checks and NaN poisoning, slices and run-time choices of rows;
- `tables`: the split tables' rows, the rotation of dynamic NTK's frequencies, the rows' layouts;
- `rotation`: the dtype the layers combine in, RoPE's channel swap;
- `attention`: what the attention layers' call needs (`keras_posenc._tf.attention`).

Here shapes are static (or symbolic under `jax.export`), a value is known unless traced
(`jax.jit`, or torch's meta tensors while Keras infers shapes), nothing asserts (a bad
traced value makes NaN rows), and every graph is XLA's (JAX) or none (PyTorch eager).
The tables are the same host arrays TensorFlow reads (the shared float64 frequency table
rounded once), read the same way: the numbers are TensorFlow's (docs/backends.md).
"""

from __future__ import annotations

from keras_posenc._keras_ops.attention import (  # noqa: F401
    asserted,
    positions_of_padding,
    run_time_shape,
    run_time_size,
    take,
    writes_in_place,
)
from keras_posenc._keras_ops.rotation import (  # noqa: F401
    accumulation_dtype,
    add_rounded_once,
    cast,
    keep_static_shape,
    reshape,
    rotation_name_scope,
    rows_fuse_into_rotation,
    split_channels,
    swap_form,
    swap_pairs,
)
from keras_posenc._keras_ops.rows import (  # noqa: F401
    SMALL_RUN_VALUES,
    after,
    as_int32_positions,
    as_positions,
    check,
    choose_at_run_time,
    clamped_positions,
    combined,
    cond,
    equal,
    int_array,
    largest,
    maximum,
    nan_unless,
    read,
    slice_rows,
    smallest,
    total_length_of_run,
    validity,
)
from keras_posenc._keras_ops.tables import (  # noqa: F401
    channel_tables,
    dynamic_words,
    encoding,
    exact_sin_cos,
    one_call_eagerly,
    run_sin_cos,
)
from keras_posenc._keras_ops.tracing import (  # noqa: F401
    assertions_dropped,
    in_xla_context,
    position_bound,
    shared_while_stored,
    traced_constant,
)
from keras_posenc._keras_ops.values import (  # noqa: F401
    is_symbolic,
    is_traced,
    static_value,
)
