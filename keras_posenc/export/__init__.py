"""Export a Keras model to SavedModel and ONNX, and check both against Keras.

One module per concern: `signature` (the serving function), `precision`, `files` (whole or
nothing), `saved_model`, `onnx_export`, `verify` and `report`; `cli` and `encoders` are the
export job (`python -m export`). Every public name is importable from here.

Both artifacts come from one serving function: a `tf.function` with an explicit, named
`tf.TensorSpec` per model input, the batch axis (0) and the sequence axis (1) left
dynamic. The layers of this package turn their host tables into constants while that
function is traced, so the ONNX graph holds plain constants and its inputs are exactly the
signature's (an eager `tf.constant` captured by a layer would appear as an extra input,
and `save_onnx` refuses such a graph).

`verify_export` runs Keras, the reloaded SavedModel and onnxruntime side by side on
shapes other than any traced one and reports, per shape, the largest absolute and
relative error of each runtime against Keras and each runtime's median latency.

Example:

```python
from keras_posenc import SinusoidalPositionalEncoding
from keras_posenc.export import save_onnx, save_saved_model, verify_export

inputs = keras.Input((None, 8), name="embeddings")
model = keras.Model(inputs, SinusoidalPositionalEncoding()(inputs))
save_saved_model(model, "out/saved_model")
save_onnx(model, "out/model.onnx")
report = verify_export(model, "out/saved_model", "out/model.onnx")  # raises if it fails
print(report["summary"]["onnxruntime"]["max_abs_error"])
```
"""

from keras_posenc.export.errors import ExportError, VerificationError
from keras_posenc.export.files import is_saved_model, whole_or_nothing, write_json
from keras_posenc.export.onnx_export import (
    DEFAULT_OPSET,
    SUPPORTED_OPSETS,
    dedupe_constants,
    onnx_constant_bytes,
    onnx_model,
    save_onnx,
)
from keras_posenc.export.precision import (
    BFLOAT16_CHOICES,
    compute_dtypes,
    exportable_model,
    float32_copy,
)
from keras_posenc.export.report import (
    FLOAT16_TOLERANCE,
    FLOAT32_TOLERANCE,
    compare_outputs,
    parameter_bytes,
    position_table_bytes,
)
from keras_posenc.export.saved_model import save_saved_model
from keras_posenc.export.signature import input_signature, serving_function
from keras_posenc.export.verify import (
    BATCH_SIZES,
    RUNTIMES,
    SEQUENCE_LENGTHS,
    default_inputs,
    longest_sequence,
    verification_shapes,
    verify_export,
)

__all__ = [
    "BATCH_SIZES",
    "BFLOAT16_CHOICES",
    "DEFAULT_OPSET",
    "FLOAT16_TOLERANCE",
    "FLOAT32_TOLERANCE",
    "RUNTIMES",
    "SEQUENCE_LENGTHS",
    "SUPPORTED_OPSETS",
    "ExportError",
    "VerificationError",
    "compare_outputs",
    "compute_dtypes",
    "dedupe_constants",
    "default_inputs",
    "exportable_model",
    "float32_copy",
    "input_signature",
    "is_saved_model",
    "longest_sequence",
    "onnx_constant_bytes",
    "onnx_model",
    "parameter_bytes",
    "position_table_bytes",
    "save_onnx",
    "save_saved_model",
    "serving_function",
    "verification_shapes",
    "verify_export",
    "whole_or_nothing",
    "write_json",
]
