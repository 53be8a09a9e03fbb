"""LiteRT (TFLite): the serving function converted with built-in ops only, and run.

The `.tflite` file comes from the same serving function as the SavedModel and the ONNX
file, so it has the same named inputs and outputs (signature `serving_default`) and the
same dynamic axes: the interpreter resizes a dynamic batch or sequence axis
(`resize_tensor_input`) and refuses to resize one the model fixes. Only LiteRT's built-in
ops are allowed: Flex ops (`SELECT_TF_OPS`) need the TensorFlow kernels linked into the
app, which neither `ai_edge_litert` nor `tf.lite.Interpreter` has, so a model that would
need one is refused with the op and the layer named.
"""

from __future__ import annotations

import os
import re
import tempfile
import warnings
from pathlib import Path

import keras
import numpy as np
import tensorflow as tf

from keras_posenc import _tf
from keras_posenc.export.backend import requires_tensorflow
from keras_posenc.export.errors import ExportError
from keras_posenc.export.files import check_file_target, whole_or_nothing
from keras_posenc.export.precision import exportable_model
from keras_posenc.export.quiet import converter_output
from keras_posenc.export.signature import (
    bounded_tracing,
    input_signature,
    layers_in_scopes,
    serving_function,
)

SIGNATURE_KEY = "serving_default"


def save_litert(
    model: keras.Model,
    path: str | os.PathLike,
    *,
    bfloat16: str = "float32",
    max_sequence_length: int | None = None,
) -> Path:
    """Writes `model` as a LiteRT (`.tflite`) file with built-in ops only.

    Example:

    ```python
    save_litert(model, "out/model.tflite")
    runner = litert_interpreter("out/model.tflite").get_signature_runner()
    runner(token_ids=np.array([[3, 1, 4]], np.int32))["encoded"]  # (1, 3, width)
    ```

    Args:
        model: a functional or `Sequential` Keras model.
        path: the `.tflite` file to write; its folder must exist.
        bfloat16: what to do with a bfloat16 model: `"float32"` exports a float32 copy
            (with a warning), `"error"` refuses.
        max_sequence_length: the largest position + 1 the file serves (with a
            `start_index` input: start plus length stay within it). Its position tables
            then hold only the rows below it, and rows past it are NaN. Default: the
            smallest learned position table of the model, else no bound.

    Returns:
        The path written.

    Raises:
        ExportError: the model needs an op LiteRT has no built-in kernel for (the message
            names the op and the layer), or the conversion failed.
    """
    requires_tensorflow("save_litert")  # before anything is written
    check_file_target(path, ".tflite")
    model, _ = exportable_model(model, bfloat16)
    with whole_or_nothing(path, kind="file") as written:
        written.write_bytes(litert_flatbuffer(model, max_sequence_length))
    return Path(path)


def litert_flatbuffer(model: keras.Model, max_sequence_length: int | None = None) -> bytes:
    """The `.tflite` bytes of `model` (what `save_litert` writes), built-in ops only."""
    with (
        _tf.tracing_for_a_converter(),  # the converter drops assertions: NaN rows instead
        bounded_tracing(model, max_sequence_length),
    ):
        concrete = serving_function(model).get_concrete_function()
    # The converter freezes variables itself, but not when the graph holds a custom
    # gradient (Keras's silu has one): then every weight stays a resource variable, which
    # LiteRT never initializes (the outputs are garbage). So freeze them all first, and
    # convert from a SavedModel of the frozen function (its signature keeps the names);
    # freezing flattens the outputs in `tf.nest.flatten` order: name them again.
    # Freezing runs Grappler, which logs its session (TensorFlow 2.20); loading the
    # SavedModel warns that gradients were not saved (none are needed), and the converter
    # logs its options: `converter_output` keeps them out.
    with (
        converter_output("tensorflow", "absl"),
        tempfile.TemporaryDirectory(prefix="keras_posenc_litert_") as folder,
    ):
        serve = _tf.frozen_named_outputs(concrete)
        module = tf.Module()
        module.serve = tf.function(serve, input_signature=input_signature(model), autograph=False)
        tf.saved_model.save(
            module,
            folder,
            signatures={SIGNATURE_KEY: module.serve.get_concrete_function()},
            # Gradients are not exported: a custom one capturing a constant cannot be.
            options=tf.saved_model.SaveOptions(experimental_custom_gradients=False),
        )
        converter = tf.lite.TFLiteConverter.from_saved_model(folder, signature_keys=[SIGNATURE_KEY])
        converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS]
        try:
            data = converter.convert()
        except Exception as error:
            raise ExportError(_conversion_failure(model, str(error))) from error
    flex = sorted(op for op in litert_ops(data) if op.startswith("Flex"))
    if flex:  # cannot happen with built-in ops only; checked since the file would not run
        raise ExportError(f"The LiteRT file of {model.name!r} has Flex ops: {', '.join(flex)}.")
    return data


def _conversion_failure(model: keras.Model, message: str) -> str:
    """What to tell the user when the converter fails: the ops, and the layers they are in."""
    ops = re.findall(r"TF Select ops: ([^\n]+)", message)
    if not ops:
        lines = [line for line in message.splitlines() if "error" in line.lower()]
        return f"The LiteRT converter could not convert the model {model.name!r}: " + (
            lines[-1][-500:] if lines else message[-500:]
        )
    scopes = dict.fromkeys(
        re.findall(r'fused\["[A-Za-z0-9]+:", callsite\("([^"@]+)@', message)
        + re.findall(r'fused\["[A-Za-z0-9]+:", "([^"@]+)@', message)
    )
    layers = layers_in_scopes(model, scopes)
    names = [op.strip() for op in ops[0].split(",")]
    fixes = [_FIXES[op] for op in names if op in _FIXES]
    return (
        f"The model {model.name!r} needs TensorFlow ops that LiteRT has no built-in kernel "
        f"for: {', '.join(names)}"
        + (f", in layer(s) {', '.join(layers)}" if layers else "")
        + ". Flex ops (SELECT_TF_OPS) would need TensorFlow inside the app, so they are not "
        "used. " + " ".join(fixes or [_FIXES["default"]])
    )


_FIXES = {
    "StridedSlice": "A StridedSlice with new axes is what Keras's use_causal_mask=True makes "
    "(dot_product_attention indexes its mask with [None, None]): pass an explicit "
    "attention_mask instead, for example keras_posenc.export.causal_mask(x).",
    "Einsum": "An Einsum converts when its inputs' ranks and non-batch sizes are known: give "
    "keras.Input its feature sizes, and make sure the layers before it keep the static "
    "shape of their outputs.",
    "default": "Replace the op in the model with one LiteRT has, or give the shapes around "
    "it static sizes.",
}


def litert_ops(model_content: bytes) -> list[str]:
    """The op names of a `.tflite` file's operators, in order (custom ops by their name)."""
    schema = _tf.tflite_schema()
    fb = schema.Model.GetRootAsModel(model_content, 0)
    names = {
        getattr(schema.BuiltinOperator, name): name
        for name in dir(schema.BuiltinOperator)
        if not name.startswith("_")
    }
    codes = []
    for i in range(fb.OperatorCodesLength()):
        code = fb.OperatorCodes(i)
        builtin = max(code.BuiltinCode(), code.DeprecatedBuiltinCode())
        if builtin == schema.BuiltinOperator.CUSTOM:
            codes.append(code.CustomCode().decode())
        else:
            codes.append(names.get(builtin, str(builtin)))
    ops = []
    for s in range(fb.SubgraphsLength()):
        subgraph = fb.Subgraphs(s)
        ops.extend(
            codes[subgraph.Operators(o).OpcodeIndex()] for o in range(subgraph.OperatorsLength())
        )
    return ops


def litert_interpreter(path_or_content: str | os.PathLike | bytes):
    """A LiteRT interpreter: `ai_edge_litert`'s when installed, else `tf.lite.Interpreter`."""
    try:
        from ai_edge_litert.interpreter import Interpreter
    except ImportError:
        Interpreter = tf.lite.Interpreter
    source = (
        {"model_content": path_or_content}
        if isinstance(path_or_content, bytes)
        else {"model_path": str(path_or_content)}
    )
    with warnings.catch_warnings():
        # TensorFlow's copy warns on every load that it is deprecated for ai_edge_litert:
        # the `litert` extra installs that; without it the copy works the same.
        warnings.filterwarnings("ignore", r"\s*Warning: tf.lite.Interpreter is deprecated")
        return Interpreter(**source)


class LiteRTRunner:
    """Runs a `.tflite` file's `serving_default` on `{input name: array}` -> `{output: array}`.

    The inputs are resized (`resize_tensor_input(strict=True)`: only dynamic axes) and the
    tensors allocated once per new set of shapes; a call then only copies the inputs in,
    invokes and copies the outputs out.
    """

    def __init__(self, path_or_content: str | os.PathLike | bytes):
        self.interpreter = litert_interpreter(path_or_content)
        runner = self.interpreter.get_signature_runner(SIGNATURE_KEY)
        self.inputs = {name: d["index"] for name, d in runner.get_input_details().items()}
        self.outputs = {name: d["index"] for name, d in runner.get_output_details().items()}
        self.signatures = {
            name: tuple(d["shape_signature"]) for name, d in runner.get_input_details().items()
        }
        self._shapes = None

    def prepare(self, feeds: dict) -> None:
        shapes = {name: tuple(np.shape(value)) for name, value in feeds.items()}
        if shapes == self._shapes:
            return
        for name, shape in shapes.items():
            try:
                self.interpreter.resize_tensor_input(self.inputs[name], list(shape), strict=True)
            except (RuntimeError, ValueError) as error:
                raise ValueError(
                    f"The LiteRT file takes input {name!r} with shape "
                    f"{self.signatures[name]} (-1: any size), not {shape}: {error}"
                ) from None
        self.interpreter.allocate_tensors()
        self._shapes = shapes

    def __call__(self, feeds: dict) -> dict[str, np.ndarray]:
        self.prepare(feeds)
        for name, value in feeds.items():
            self.interpreter.set_tensor(self.inputs[name], value)
        self.interpreter.invoke()
        return {name: self.interpreter.get_tensor(index) for name, index in self.outputs.items()}
