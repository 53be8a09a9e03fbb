"""Verification: Keras and every exported runtime on the same inputs, compared.

- `coverage`: what is run (the shapes a model accepts, starts and positions that reach
  every position table near its first and last rows);
- `runtimes`: one runner per runtime (Keras, SavedModel, onnxruntime, LiteRT) and the one
  quiet onnxruntime session (`onnx_session`);
- `compare`: the tolerances and how a runtime's outputs are compared with the reference;
- `report`: the bytes of an export and the lines of the report;
- `driver`: `verify_export`, in named steps.
"""

from keras_posenc.export.verify.compare import (
    FLOAT16_TOLERANCE,
    FLOAT32_TOLERANCE,
    compare_outputs,
    summarize,
)
from keras_posenc.export.verify.coverage import (
    BATCH_SIZES,
    SEQUENCE_LENGTHS,
    default_inputs,
    longest_sequence,
    position_inputs,
    position_limit,
    verification_cases,
    verification_shapes,
)
from keras_posenc.export.verify.driver import verify_export
from keras_posenc.export.verify.report import (
    litert_constant_bytes,
    parameter_bytes,
    position_table_bytes,
    saved_model_constant_bytes,
)
from keras_posenc.export.verify.runtimes import RUNTIMES, onnx_session

__all__ = [
    "BATCH_SIZES",
    "FLOAT16_TOLERANCE",
    "FLOAT32_TOLERANCE",
    "RUNTIMES",
    "SEQUENCE_LENGTHS",
    "compare_outputs",
    "default_inputs",
    "litert_constant_bytes",
    "longest_sequence",
    "onnx_session",
    "parameter_bytes",
    "position_inputs",
    "position_limit",
    "position_table_bytes",
    "saved_model_constant_bytes",
    "summarize",
    "verification_cases",
    "verification_shapes",
    "verify_export",
]
