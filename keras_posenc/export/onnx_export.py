"""ONNX: the serving function converted by tf2onnx, rewritten by `onnx_passes`, checked.

The TensorFlow half of the ONNX export: the graph passes themselves import no TensorFlow.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import keras
import numpy as np

from keras_posenc.backend import tensorflow as tf_backend
from keras_posenc.export import onnx_passes
from keras_posenc.export.backend import requires_tensorflow
from keras_posenc.export.errors import ExportError
from keras_posenc.export.files import check_file_target, whole_or_nothing
from keras_posenc.export.onnx_passes.graph import graphs
from keras_posenc.export.precision import exportable_model
from keras_posenc.export.quiet import converter_output
from keras_posenc.export.signature import (
    bounded_tracing,
    input_signature,
    layers_in_scopes,
    named_outputs,
    serving_function,
)
from keras_posenc.export.tf2onnx_private import deterministic_order, number_address_names

DEFAULT_OPSET = 17
# tf2onnx 1.17 writes opsets up to 18; below 13 it cannot convert the einsums and batched
# matmuls of attention layers. 23 is written as 18 and converted, for ONNX's own
# RotaryEmbedding op.
TF2ONNX_MAX_OPSET = 18
SUPPORTED_OPSETS = (*range(13, TF2ONNX_MAX_OPSET + 1), onnx_passes.STANDARD_ROTARY_OPSET)
ROTARY_FORMS = ("fused", "decomposed")
# The caller's own rewrites of the converted graph, applied in order to every export (the
# step `extra` of `onnx_passes.PASSES`) unless `passes` is given: each takes the
# `onnx.ModelProto` and changes it in place (or returns a new one). The package's own are
# the other steps of `PASSES`.
GRAPH_PASSES: list[Callable] = []
# What to do about a TensorFlow op tf2onnx leaves unconverted, by the layers that make it.
_FIXES = {
    "Expm1": "'celu' makes it: use 'elu', the same function for alpha 1",
}


def save_onnx(
    model: keras.Model,
    path: str | os.PathLike,
    opset: int = DEFAULT_OPSET,
    *,
    rotary: str = "fused",
    bfloat16: str = "float32",
    passes: Sequence[Callable] | None = None,
    max_sequence_length: int | None = None,
) -> Path:
    """Writes `model` as an ONNX file, converted by tf2onnx from its serving function.

    The graph's inputs are the model's inputs by name (axis 0 named `batch`, axis 1
    `sequence`), its outputs the model's named outputs. Constants tf2onnx leaves
    duplicated are merged (`dedupe_constants`); the result passes
    `onnx.checker.check_model(full_check=True)`.

    Example:

    ```python
    save_onnx(model, "out/model.onnx")
    session = onnxruntime.InferenceSession("out/model.onnx")
    (encoded,) = session.run(None, {"token_ids": np.array([[3, 1, 4]], np.int32)})
    ```

    Args:
        model: a functional or `Sequential` Keras model.
        path: the `.onnx` file to write; its folder must exist.
        opset: the ONNX opset, in `SUPPORTED_OPSETS` (13 to 18, or 23: written as 18
            and converted).
        rotary: how RoPE is written: `"fused"` as onnxruntime's
            `com.microsoft.RotaryEmbedding` (opset 23: ONNX's `RotaryEmbedding`), or
            `"decomposed"`, standard ops only (a Split and a Concat per swap).
        bfloat16: what to do with a bfloat16 model: `"float32"` exports a float32 copy
            (with a warning), `"error"` refuses.
        passes: graph rewrites applied to the converted graph before it is checked
            (default `GRAPH_PASSES`); see `onnx_model`.
        max_sequence_length: the largest position + 1 the file serves (with a
            `start_index` input: start plus length stay within it). Its position tables
            then hold only the rows below it, and rows past it are NaN. Default: the
            smallest learned position table of the model, else no bound.

    Returns:
        The path written.
    """
    requires_tensorflow("save_onnx")  # before anything is written
    if isinstance(opset, bool) or not isinstance(opset, (int, np.integer)):
        raise TypeError(f"opset must be an integer, got {opset!r}.")
    if opset not in SUPPORTED_OPSETS:
        raise ValueError(
            f"ONNX opset {opset} is not supported: tf2onnx writes opsets 13 to 18, and 23 "
            f"is converted from 18. Use opset={DEFAULT_OPSET} (the default), another of "
            f"{SUPPORTED_OPSETS}."
        )
    if rotary not in ROTARY_FORMS:
        raise ValueError(f"Unknown rotary={rotary!r}; expected one of {ROTARY_FORMS}.")
    import onnx

    check_file_target(path, ".onnx")
    model, _ = exportable_model(model, bfloat16)
    with whole_or_nothing(path, kind="file") as written:
        proto = onnx_model(
            model, opset, rotary=rotary, passes=passes, max_sequence_length=max_sequence_length
        )
        onnx.save(proto, str(written))
    return Path(path)


def _refuse_shared_names(model: keras.Model, input_names: list[str]) -> None:
    """ONNX names inputs and outputs in one namespace; tf2onnx fails on a clash with an
    error that names neither the output nor the fix."""
    try:
        structure = model.output
    except AttributeError:
        return  # no symbolic outputs: the converter's own checks decide
    for name in named_outputs(model, structure):
        if name in input_names:
            raise ExportError(
                f"The model's output {name!r} has the name of an input: an ONNX graph "
                f"cannot have both. Rename the output (e.g. {'next_' + name!r}; the key of "
                "the output dict or the output layer's name)."
            )


def onnx_model(
    model: keras.Model,
    opset: int = DEFAULT_OPSET,
    *,
    rotary: str | None = "fused",
    passes: Sequence[Callable] | None = None,
    max_sequence_length: int | None = None,
):
    """The checked `onnx.ModelProto` of `model` (what `save_onnx` writes).

    Args:
        model: a functional or `Sequential` Keras model.
        opset: the ONNX opset, in `SUPPORTED_OPSETS`.
        rotary: `"fused"` or `"decomposed"` (see `save_onnx`); None leaves the rotations as
            tf2onnx converted them (and the opset at most 18).
        passes: functions `pass_(proto)` applied in order to tf2onnx's graph before any
            check, each changing the proto in place or returning a new one (default
            `GRAPH_PASSES`; the step `extra` of `onnx_passes.PASSES`). Whatever they make
            must still pass the checks below and `verify_export`.
        max_sequence_length: the bound of the positions served (see `save_onnx`).
    """
    specs = input_signature(model)
    _refuse_shared_names(model, [spec.name for spec in specs])
    proto = _converted(model, specs, opset, max_sequence_length)
    target = onnx_passes.Target(
        rotary,
        opset,
        extra=tuple(GRAPH_PASSES if passes is None else passes),
        check=lambda converted: _check_converted(model, converted, [s.name for s in specs]),
    )
    return onnx_passes.run_pipeline(proto, target)


def _converted(model: keras.Model, specs, opset: int, max_sequence_length: int | None):
    """tf2onnx's `onnx.ModelProto` of `model`'s serving function, at most opset 18, the same
    in every process (`tf2onnx_private`: its order fixed, its address names numbered)."""
    import tf2onnx

    function = serving_function(model)
    # tf2onnx deep-copies the whole graph before each of its optimizer passes so that it
    # can skip a pass that fails; without the copies conversion takes half the time. Only
    # if a pass does fail is the conversion repeated with them.
    for catch_errors in ("FALSE", "TRUE"):
        try:
            # Traced for a converter that drops assertions: bad positions give NaN rows.
            with (
                _environment(TF2ONNX_CATCH_ERRORS=catch_errors),
                converter_output("tf2onnx"),
                deterministic_order(),
                tf_backend.tracing_for_a_converter(),
                bounded_tracing(model, max_sequence_length),
            ):
                proto, _ = tf2onnx.convert.from_function(
                    function, input_signature=specs, opset=min(opset, TF2ONNX_MAX_OPSET)
                )
        except Exception as error:
            if catch_errors == "TRUE":
                raise ExportError(
                    f"tf2onnx could not convert the model {model.name!r} at opset {opset}: {error}"
                ) from error
            continue
        number_address_names(proto)
        return proto


def _check_converted(model: keras.Model, proto, names: list[str]) -> None:
    """Refuses a converted graph with ops ONNX lacks (naming their layers and the fix) or
    with inputs other than the signature's (a captured constant)."""
    import onnx

    unknown = {}
    for graph in graphs(proto.graph):
        for node in graph.node:
            if not onnx.defs.has(node.op_type, node.domain):
                unknown.setdefault(node.op_type, []).append(node.name)
    if unknown:
        parts = []
        for op, nodes in sorted(unknown.items()):
            layers = layers_in_scopes(model, nodes)
            where = f" in layer(s) {', '.join(layers)}" if layers else ""
            fix = _FIXES.get(op, "replace it in the model with ops ONNX has")
            parts.append(f"{op}{where} ({fix})")
        raise ExportError(
            f"tf2onnx left TensorFlow ops it cannot convert in the graph of {model.name!r}: "
            + "; ".join(parts)
            + "."
        )
    graph_inputs = [i.name for i in proto.graph.input]
    if graph_inputs != names:
        extra = sorted(set(graph_inputs) - set(names))
        raise ExportError(
            f"The ONNX graph's inputs {graph_inputs} are not the signature's {names}. "
            + (
                f"The extra inputs {extra} are tensors the traced function captured, such as "
                "a tf.constant created eagerly and stored on a layer; keep numpy arrays on "
                "the layer and convert them inside call()."
                if extra
                else ""
            )
        )


@contextlib.contextmanager
def _environment(**variables: str) -> Iterator[None]:
    saved = {name: os.environ.get(name) for name in variables}
    os.environ.update(variables)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def onnx_constant_bytes(proto_or_path) -> int:
    """Bytes of every constant in an ONNX model: initializers and `Constant` nodes, all graphs."""
    import onnx
    from onnx import numpy_helper

    proto = (
        proto_or_path
        if isinstance(proto_or_path, onnx.ModelProto)
        else onnx.load(str(proto_or_path))
    )
    total = 0
    for graph in graphs(proto.graph):
        total += sum(numpy_helper.to_array(i).nbytes for i in graph.initializer)
        for node in graph.node:
            for attribute in node.attribute:
                if attribute.type == onnx.AttributeProto.TENSOR:
                    total += numpy_helper.to_array(attribute.t).nbytes
    return total
