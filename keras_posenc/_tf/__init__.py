"""Every TensorFlow / XLA / Keras specific the package relies on, each with why and when it can go.

The layers are written once for every backend, in `keras.ops`; what is here is how to make
TensorFlow run them at the memory floor in every mode and keep the graphs it exports: what
the rows need (`rows`), what the rotation and the additive encodings need (`rotation`),
what the attention layers need (`attention`), the graph being traced (XLA, an export's
bound, a converter: `tracing`) and the few private APIs the package touches (`private`).
`keras_posenc._keras_ops` gives the same names for JAX and PyTorch; `_lazy.tricks()` is
the backend's one. The benchmark cases that justify each trick are named
(`python -m benchmarks`, see docs/benchmarks.md); if a TensorFlow release makes a case fast
without the trick, the trick can go.
"""

from __future__ import annotations

# A host array as a graph constant (defined without TensorFlow: every backend's tables hold it).
from keras_posenc._host_constant import HostConstant  # noqa: F401

# What the attention layers' shared call asks of this backend (see `attention`; the same
# names are in `keras_posenc._keras_ops` for JAX and PyTorch).
from keras_posenc._tf.attention import (  # noqa: F401
    asserted,
    positions_of_padding,
    run_time_shape,
    run_time_size,
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

# What the rotation and the additive encodings ask of this backend (see `rotation`).
from keras_posenc._tf.rotation import (  # noqa: F401
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

# What the rows ask of this backend (see `rows`).
from keras_posenc._tf.rows import (  # noqa: F401
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

# The values of the rows in the graph: the split tables, dynamic NTK, layouts (`tables`).
from keras_posenc._tf.tables import (  # noqa: F401
    channel_tables,
    dynamic_words,
    encoding,
    exact_sin_cos,
    one_call_eagerly,
    run_sin_cos,
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

# Values known while tracing, or only at run time (see `values`).
from keras_posenc._tf.values import is_symbolic, is_traced, static_value  # noqa: F401
