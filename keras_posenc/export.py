"""Export a Keras model to SavedModel and ONNX, and check both against Keras.

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

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import math
import os
import shutil
import statistics
import tempfile
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import keras
import numpy as np
import tensorflow as tf

DEFAULT_OPSET = 17
# tf2onnx 1.17 writes opsets up to 18; below 13 it cannot convert the einsums and batched
# matmuls of attention layers.
SUPPORTED_OPSETS = range(13, 19)
BATCH_SIZES = (1, 2, 3, 8)
SEQUENCE_LENGTHS = (1, 2, 17, 128, 511)
FLOAT32_TOLERANCE = {"atol": 1e-5, "rtol": 1e-4}
FLOAT16_TOLERANCE = {"atol": 1e-2, "rtol": 1e-2}
BFLOAT16_CHOICES = ("float32", "error")
RUNTIMES = ("keras", "saved_model", "onnxruntime")

_LOW_PRECISION = ("float16", "bfloat16")


class ExportError(RuntimeError):
    """An export that cannot be written correctly (the message says why and what to do)."""


class VerificationError(ExportError):
    """A verification that failed; `report` holds the full report that says where."""

    def __init__(self, message: str, report: dict):
        super().__init__(message)
        self.report = report


# --------------------------------------------------------------------------------------
# The serving function


def input_signature(model: keras.Model) -> list[tf.TensorSpec]:
    """One named `tf.TensorSpec` per model input, with dynamic batch and sequence axes.

    Axis 0 of an input is its batch and axis 1 its sequence; both become `None` (other
    axes keep the model's sizes). A rank-0 input, such as a decoding `start_index`,
    stays a scalar.

    Args:
        model: a functional or `Sequential` Keras model (one with `model.inputs`).

    Returns:
        The specs in the order of `model.inputs`, named by the inputs' names.
    """
    inputs = _model_inputs(model)
    specs = []
    for tensor in inputs:
        shape = list(tensor.shape)
        shape[:2] = [None] * min(len(shape), 2)
        if any(size is None for size in shape[2:]):
            raise ExportError(
                f"Input {tensor.name!r} has shape {tuple(tensor.shape)}; only the batch "
                "(axis 0) and sequence (axis 1) may be unknown. Give the other axes a size "
                "in keras.Input(shape=...)."
            )
        specs.append(tf.TensorSpec(shape, tf.as_dtype(tensor.dtype), name=tensor.name))
    names = [spec.name for spec in specs]
    if len(set(names)) != len(names):
        raise ExportError(f"Model input names must be unique, got {names}.")
    return specs


def _model_inputs(model) -> list:
    if not isinstance(model, keras.Model):
        raise TypeError(f"Expected a keras.Model, got {type(model).__name__}.")
    try:
        inputs = model.inputs
    except AttributeError:
        inputs = None
    if not inputs:
        raise ExportError(
            f"The model {model.name!r} has no inputs to export (a subclassed model, or one "
            "that was never built). Export a functional model: "
            "`inputs = keras.Input(shape=(None,), dtype='int32', name='token_ids')`, "
            "`model = keras.Model(inputs, subclassed_model(inputs))`."
        )
    return list(inputs)


def _named_outputs(model: keras.Model, outputs) -> dict[str, tf.Tensor]:
    """The model's outputs as `{name: tensor}`: dict keys, else the model's output names."""
    if isinstance(outputs, dict):
        return dict(outputs)
    flat = keras.tree.flatten(outputs)
    names = list(getattr(model, "output_names", None) or [])  # Sequential models have none
    if len(names) != len(flat) or len(set(names)) != len(names):
        names = [f"output_{i}" for i in range(len(flat))]
    return dict(zip(names, flat, strict=True))


def _input_packer(model: keras.Model) -> Callable[[Sequence], Any]:
    """Packs tensors given in the order of `model.inputs` into what `model` takes."""
    try:
        structure = model.input  # a functional model's own structure (list, dict, ...)
    except AttributeError:  # a Sequential model: one input
        structure = None
    if isinstance(structure, (dict, list, tuple)):
        return lambda tensors: keras.tree.pack_sequence_as(structure, list(tensors))
    return lambda tensors: tensors[0] if len(tensors) == 1 else list(tensors)


def serving_function(model: keras.Model) -> tf.types.experimental.GenericFunction:
    """The model as a `tf.function` with an explicit named signature, returning `{name: tensor}`.

    Args:
        model: a functional or `Sequential` Keras model.

    Returns:
        A `tf.function` taking the inputs positionally in the order of `input_signature`.
    """
    specs = input_signature(model)
    pack = _input_packer(model)

    def serve(*tensors):
        return _named_outputs(model, model(pack(tensors), training=False))

    return tf.function(serve, input_signature=specs, autograph=False)


# --------------------------------------------------------------------------------------
# Precision


def compute_dtypes(model: keras.Model) -> set[str]:
    """The compute dtypes of the model's layers and the dtypes of its float variables."""
    dtypes = {
        layer.dtype_policy.compute_dtype
        for layer in _all_layers(model)
        if getattr(layer, "dtype_policy", None) is not None
    }
    dtypes.update(v.dtype for v in model.weights if keras.backend.is_float_dtype(v.dtype))
    return {keras.backend.standardize_dtype(d) for d in dtypes}


def _all_layers(model: keras.Model) -> list:
    """The model and every layer in it, nested ones included (Keras has no public walk)."""
    return list(model._flatten_layers(include_self=True, recursive=True))


def float32_copy(model: keras.Model) -> keras.Model:
    """A copy of `model` that computes and stores everything in float32, with the same weights.

    Every dtype policy (`bfloat16`, `mixed_bfloat16`, `float16`, `mixed_float16`) and every
    low-precision input dtype in the model's config becomes `float32`; weights are cast up
    (exactly: float32 holds every bfloat16 and float16 value).

    Args:
        model: a Keras model whose config round-trips (`get_config` / `from_config`).

    Returns:
        A new model.
    """
    config = _float32_config(keras.saving.serialize_keras_object(model))
    copy = keras.saving.deserialize_keras_object(config)
    weights = model.get_weights()
    copy.set_weights(
        [
            w.astype(np.float32)
            if keras.backend.standardize_dtype(w.dtype) in _LOW_PRECISION
            else w
            for w in weights
        ]
    )
    return copy


def _float32_config(config):
    if isinstance(config, dict):
        result = {}
        for key, value in config.items():
            if key == "dtype" and isinstance(value, str) and _is_low_precision(value):
                value = "float32"
            elif (
                key in ("dtype", "dtype_policy")
                and isinstance(value, dict)
                and value.get("class_name") == "DTypePolicy"
            ):
                value = {**value, "config": {**value["config"], "name": "float32"}}
            result[key] = _float32_config(value)
        return result
    if isinstance(config, list):
        return [_float32_config(value) for value in config]
    return config


def _is_low_precision(dtype_name: str) -> bool:
    return dtype_name.removeprefix("mixed_") in _LOW_PRECISION


def exportable_model(model: keras.Model, bfloat16: str = "float32") -> tuple[keras.Model, list]:
    """The model to export and notes on what was changed.

    bfloat16 cannot go to ONNX: tf2onnx maps it to float16 and writes a broken graph
    (tensorflow-onnx#2337), and onnxruntime's CPU has no bfloat16 MatMul. A model that uses
    bfloat16 anywhere is exported as its `float32_copy` (`bfloat16="float32"`, with a
    warning) or refused (`bfloat16="error"`).
    """
    if bfloat16 not in BFLOAT16_CHOICES:
        raise ValueError(f"bfloat16 must be one of {BFLOAT16_CHOICES}, got {bfloat16!r}.")
    _model_inputs(model)
    if "bfloat16" not in compute_dtypes(model):
        return model, []
    if bfloat16 == "error":
        raise ExportError(
            f"The model {model.name!r} uses bfloat16, which cannot be exported to ONNX "
            "(tf2onnx writes a broken graph, tensorflow-onnx#2337; onnxruntime's CPU has no "
            "bfloat16 MatMul). Export a float32 copy: pass bfloat16='float32', or call "
            "keras_posenc.export.float32_copy(model) and export that."
        )
    note = (
        f"The model {model.name!r} uses bfloat16; exported a float32 copy with the same "
        "weights instead (bfloat16 does not export to ONNX, tensorflow-onnx#2337)."
    )
    warnings.warn(note, stacklevel=3)
    return float32_copy(model), [note]


# --------------------------------------------------------------------------------------
# Writing files whole or not at all


@contextlib.contextmanager
def whole_or_nothing(
    target: str | os.PathLike, replace_if: Callable[[Path], bool] | None = None
) -> Iterator[Path]:
    """Yields a path to write in place of `target`; renamed to `target` only on success.

    The path lies in a fresh temporary folder next to `target` (the same file system, so
    the rename is atomic for a file); that folder is removed afterwards whatever happens.
    An existing file at `target` is replaced; an existing folder only when it is empty
    or `replace_if(folder)` holds (it is moved aside, the new one renamed in, the old one
    removed).

    Example:

    ```python
    with whole_or_nothing("out/report.json") as path:
        path.write_text("{}")  # out/report.json appears only when this block succeeds
    ```

    Args:
        target: the file or folder to write.
        replace_if: which existing folders may be replaced.
    """
    target = Path(target)
    parent = target.parent
    if parent.exists() and not parent.is_dir():
        raise NotADirectoryError(
            errno.ENOTDIR,
            f"{str(parent)!r} is a file, not a folder to write {target.name!r} into",
            str(parent),
        )
    if not parent.is_dir():
        raise FileNotFoundError(
            errno.ENOENT,
            f"The folder {str(parent)!r} to write {target.name!r} into does not exist; "
            "create it first",
            str(parent),
        )
    if target.is_dir() and any(target.iterdir()):
        if replace_if is None or not replace_if(target):
            raise FileExistsError(
                errno.EEXIST,
                f"{str(target)!r} is a folder with other contents than this export would "
                "write; remove it or choose another path",
                str(target),
            )
    try:
        staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=parent))
    except OSError as error:
        raise OSError(
            error.errno,
            f"Cannot write into {str(parent)!r} ({error.strerror}); choose a folder you can "
            "write to",
            str(parent),
        ) from error
    try:
        written = staging / target.name
        yield written
        if not written.exists():
            raise ExportError(f"Nothing was written for {str(target)!r}.")
        if target.is_dir():
            aside = staging / ".replaced"
            os.replace(target, aside)
            try:
                os.replace(written, target)
            except OSError:
                os.replace(aside, target)
                raise
        else:
            os.replace(written, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def is_saved_model(folder: Path) -> bool:
    """Whether `folder` holds a SavedModel."""
    return (Path(folder) / "saved_model.pb").is_file()


def write_json(data: dict, path: str | os.PathLike) -> Path:
    """Writes `data` as indented JSON to `path`, whole or not at all."""
    with whole_or_nothing(path) as written:
        written.write_text(json.dumps(data, indent=2) + "\n")
    return Path(path)


# --------------------------------------------------------------------------------------
# SavedModel


def save_saved_model(
    model: keras.Model, path: str | os.PathLike, *, bfloat16: str = "float32"
) -> Path:
    """Writes `model` as a SavedModel with a `serving_default` signature.

    The signature takes the model's inputs by name, with dynamic batch and sequence axes,
    and returns a dict of the model's named outputs. The SavedModel loads with
    `tf.saved_model.load` alone: no Keras and no `keras_posenc` needed.

    Example:

    ```python
    save_saved_model(model, "out/saved_model")
    # Elsewhere, with TensorFlow alone:
    serve = tf.saved_model.load("out/saved_model").signatures["serving_default"]
    serve(token_ids=tf.constant([[3, 1, 4]]))["encoded"]  # (1, 3, width)
    ```

    Args:
        model: a functional or `Sequential` Keras model.
        path: the SavedModel folder to write. Its parent folder must exist; an existing
            SavedModel there is replaced, anything else is left alone (an error).
        bfloat16: what to do with a bfloat16 model: `"float32"` exports a float32 copy
            (with a warning), `"error"` refuses. TensorFlow could serve bfloat16, but the
            SavedModel holds the same model as the ONNX file so that both can be checked.

    Returns:
        The path written.
    """
    model, _ = exportable_model(model, bfloat16)
    specs = input_signature(model)
    with whole_or_nothing(path, replace_if=is_saved_model) as written:
        archive = keras.export.ExportArchive()
        archive.track(model)
        archive.add_endpoint("serving_default", serving_function(model).python_function, specs)
        archive.write_out(str(written), verbose=False)
    return Path(path)


# --------------------------------------------------------------------------------------
# ONNX


def save_onnx(
    model: keras.Model,
    path: str | os.PathLike,
    opset: int = DEFAULT_OPSET,
    *,
    bfloat16: str = "float32",
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
        opset: the ONNX opset, in `SUPPORTED_OPSETS` (13 to 18).
        bfloat16: what to do with a bfloat16 model: `"float32"` exports a float32 copy
            (with a warning), `"error"` refuses.

    Returns:
        The path written.
    """
    if isinstance(opset, bool) or not isinstance(opset, (int, np.integer)):
        raise TypeError(f"opset must be an integer, got {opset!r}.")
    if opset not in SUPPORTED_OPSETS:
        raise ValueError(
            f"ONNX opset {opset} is not supported: tf2onnx writes opsets "
            f"{SUPPORTED_OPSETS.start} to {SUPPORTED_OPSETS.stop - 1}. Use opset="
            f"{DEFAULT_OPSET} (the default) or another in that range."
        )
    import onnx

    model, _ = exportable_model(model, bfloat16)
    if Path(path).is_dir():
        raise IsADirectoryError(
            errno.EISDIR, f"{str(path)!r} is a folder; give the path of a .onnx file", str(path)
        )
    with whole_or_nothing(path) as written:
        onnx.save(onnx_model(model, opset), str(written))
    return Path(path)


def onnx_model(model: keras.Model, opset: int = DEFAULT_OPSET):
    """The checked `onnx.ModelProto` of `model` (what `save_onnx` writes)."""
    import onnx
    import tf2onnx

    specs = input_signature(model)
    function = serving_function(model)
    proto = None
    # tf2onnx deep-copies the whole graph before each of its optimizer passes so that it
    # can skip a pass that fails; without the copies conversion takes half the time. Only
    # if a pass does fail is the conversion repeated with them.
    for catch_errors in ("FALSE", "TRUE"):
        try:
            with _environment(TF2ONNX_CATCH_ERRORS=catch_errors), _quiet("tf2onnx"):
                proto, _ = tf2onnx.convert.from_function(
                    function, input_signature=specs, opset=opset
                )
            break
        except Exception as error:
            if catch_errors == "TRUE":
                raise ExportError(
                    f"tf2onnx could not convert the model {model.name!r} at opset {opset}: {error}"
                ) from error

    unknown = sorted(
        {
            node.op_type
            for graph in _graphs(proto.graph)
            for node in graph.node
            if not onnx.defs.has(node.op_type, node.domain)
        }
    )
    if unknown:
        raise ExportError(
            f"tf2onnx left TensorFlow ops it cannot convert in the graph of {model.name!r}: "
            f"{', '.join(unknown)}. Replace them in the model (for example the exact 'gelu', "
            "which uses Erfc, with gelu(approximate=True) or 'silu')."
        )
    names = [spec.name for spec in specs]
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
    dedupe_constants(proto)
    _name_dynamic_axes(proto)
    onnx.checker.check_model(proto, full_check=True)
    return proto


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


@contextlib.contextmanager
def _quiet(logger_name: str) -> Iterator[None]:
    logger = logging.getLogger(logger_name)
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def _name_dynamic_axes(proto) -> None:
    """Names axis 0 `batch` and axis 1 `sequence` of inputs and outputs where they are unknown."""
    for value in [*proto.graph.input, *proto.graph.output]:
        dims = value.type.tensor_type.shape.dim
        for axis, name in enumerate(("batch", "sequence")[: len(dims)]):
            if not dims[axis].HasField("dim_value"):
                dims[axis].dim_param = name


def _graphs(graph) -> Iterable:
    """`graph` and every subgraph in it (If branches, Loop bodies), outermost first."""
    import onnx

    yield graph
    for node in graph.node:
        for attribute in node.attribute:
            if attribute.type == onnx.AttributeProto.GRAPH:
                yield from _graphs(attribute.g)
            elif attribute.type == onnx.AttributeProto.GRAPHS:
                for subgraph in attribute.graphs:
                    yield from _graphs(subgraph)


def dedupe_constants(proto) -> None:
    """Removes the duplicated constants tf2onnx leaves, in place.

    - `Shape` of an initializer becomes an initializer: tf2onnx keeps each einsum kernel
      a second time, reshaped, only to read its shape;
    - identical initializers, in any subgraph, become one initializer of the main graph,
      which subgraphs read by name: every traced use of a host position table is its own
      constant, inside the branches of an `If`;
    - initializers nothing reads are removed.
    """
    from onnx import numpy_helper

    graphs = list(_graphs(proto.graph))
    initializers = {i.name: i for g in graphs for i in g.initializer}
    for graph in graphs:
        for node in list(graph.node):
            if node.op_type == "Shape" and node.input[0] in initializers:
                dims = list(initializers[node.input[0]].dims)
                bounds = {a.name: a.i for a in node.attribute}
                shape = dims[bounds.get("start", 0) : bounds.get("end", len(dims))]
                graph.node.remove(node)
                graph.initializer.append(
                    numpy_helper.from_array(np.array(shape, np.int64), node.output[0])
                )

    canonical: dict[tuple, str] = {}
    renamed: dict[str, str] = {}
    for graph in graphs:
        # A subgraph must produce its outputs itself: constants it returns stay where they are.
        returned = {o.name for o in graph.output}
        for initializer in list(graph.initializer):
            if initializer.name in returned:
                continue
            value = numpy_helper.to_array(initializer)
            key = (value.dtype.str, value.shape, hashlib.sha256(value.tobytes()).hexdigest())
            if key in canonical:
                renamed[initializer.name] = canonical[key]
                graph.initializer.remove(initializer)
            else:
                canonical[key] = initializer.name
                if graph is not proto.graph:
                    graph.initializer.remove(initializer)
                    proto.graph.initializer.append(initializer)
    for graph in graphs:
        for node in graph.node:
            for index, name in enumerate(node.input):
                node.input[index] = renamed.get(name, name)

    read = {name for g in graphs for node in g.node for name in node.input}
    for graph in graphs:
        returned = {o.name for o in graph.output}
        for initializer in list(graph.initializer):
            if initializer.name not in read | returned:
                graph.initializer.remove(initializer)


# --------------------------------------------------------------------------------------
# Sizes


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
    for graph in _graphs(proto.graph):
        total += sum(numpy_helper.to_array(i).nbytes for i in graph.initializer)
        for node in graph.node:
            for attribute in node.attribute:
                if attribute.type == onnx.AttributeProto.TENSOR:
                    total += numpy_helper.to_array(attribute.t).nbytes
    return total


def parameter_bytes(model: keras.Model) -> int:
    """Bytes of the model's weights (trainable and not)."""
    return sum(
        math.prod(v.shape) * np.dtype(keras.backend.standardize_dtype(v.dtype)).itemsize
        for v in model.weights
    )


def position_table_bytes(model: keras.Model) -> int:
    """Bytes of the host position tables the model's layers turn into graph constants.

    Each distinct table counts once: its cached rows and the two-table split that serves
    positions past the cache (see `keras_posenc.frequencies`).
    """
    tables = {}
    for layer in _all_layers(model):
        table = getattr(layer, "_table", None)
        if table is not None and hasattr(table, "cached"):
            tables[id(table)] = table
    total = 0
    for table in tables.values():
        total += sum(array.nbytes for array in table.cached)
        total += sum(t.array.nbytes for t in table.frequencies._split_tables)
    return total


# --------------------------------------------------------------------------------------
# Verification


def longest_sequence(model: keras.Model) -> int | None:
    """The longest sequence the model allows, when its layers say: the smallest learned table."""
    from keras_posenc.learned import LearnedPositionalEmbedding

    lengths = [
        layer.max_length
        for layer in _all_layers(model)
        if isinstance(layer, LearnedPositionalEmbedding)
    ]
    return min(lengths) if lengths else None


def verification_shapes(
    longest: int | None,
    batch_sizes: Sequence[int] = BATCH_SIZES,
    sequence_lengths: Sequence[int] = SEQUENCE_LENGTHS,
) -> list[tuple[int, int]]:
    """`(batch, sequence)` pairs: every batch size with every length up to `longest`, and it."""
    lengths = sorted(
        {n for n in sequence_lengths if longest is None or n <= longest}
        | ({longest} if longest else set())
    )
    return [(batch, length) for batch in batch_sizes for length in lengths]


def default_inputs(
    model: keras.Model, batch: int, sequence: int, longest: int | None, seed: int = 0
) -> dict[str, np.ndarray]:
    """Random inputs for `model`, by input name, for one verification shape.

    Float inputs are standard normal; integer inputs of rank >= 1 are token ids below the
    smallest `Embedding` vocabulary in the model (0 or 1 without one); a scalar integer
    input is a start index, `(longest - sequence) // 2` (so the run stays within the
    longest length; 0 when none is known).
    """
    rng = np.random.default_rng([seed, batch, sequence])
    vocabularies = [
        layer.input_dim for layer in _all_layers(model) if isinstance(layer, keras.layers.Embedding)
    ]
    high = min(vocabularies) if vocabularies else 2
    feeds = {}
    for spec in input_signature(model):
        shape = [batch, sequence, *spec.shape[2:]][: spec.shape.rank]
        dtype = spec.dtype.as_numpy_dtype
        if spec.dtype.is_floating:
            value = rng.standard_normal(shape)
        elif spec.dtype == tf.bool:
            value = rng.integers(0, 2, shape)
        elif spec.shape.rank == 0:
            value = np.array(max((longest or sequence) - sequence, 0) // 2)
        else:
            value = rng.integers(0, high, shape)
        feeds[spec.name] = np.asarray(value).astype(dtype)
    return feeds


def compare_outputs(outputs: dict, reference: dict, tolerance: dict) -> dict:
    """How far `outputs` are from `reference`, over all outputs, and whether that passes.

    Returns `max_abs_error`; `max_rel_error`, `|a - b| / |b|` over nonzero references (as
    numpy reports it: large where an output is near zero); `tolerance_used`, the largest
    `|a - b| / (atol + rtol·|b|)`; and `passed`, `allclose(atol, rtol)`, that is
    `tolerance_used <= 1` with no NaN. A missing output or a shape other than the
    reference's fails, with `problems` saying which.
    """
    atol, rtol = tolerance["atol"], tolerance["rtol"]
    result = {"max_abs_error": 0.0, "max_rel_error": 0.0, "tolerance_used": 0.0, "passed": True}
    problems = []
    for name, expected in reference.items():
        if name not in outputs:
            problems.append(f"output {name!r} is missing")
            continue
        actual = np.asarray(outputs[name], np.float64)
        expected = np.asarray(expected, np.float64)
        if actual.shape != expected.shape:
            problems.append(f"output {name!r} has shape {actual.shape}, expected {expected.shape}")
            continue
        difference = np.abs(actual - expected)
        if not np.all(np.isfinite(difference)):
            problems.append(f"output {name!r} has NaN or infinite values (here or in Keras)")
            difference = np.where(np.isfinite(difference), difference, np.inf)
        nonzero = expected != 0
        relative = difference[nonzero] / np.abs(expected[nonzero])
        used = difference / (atol + rtol * np.abs(expected))
        for key, values in (
            ("max_abs_error", difference),
            ("max_rel_error", relative),
            ("tolerance_used", used),
        ):
            result[key] = max(result[key], float(values.max(initial=0.0)))
    result["passed"] = not problems and result["tolerance_used"] <= 1.0
    if problems:
        result["problems"] = problems
    return result


def _median_latencies(calls: dict[str, Callable[[], Any]], repeats: int) -> dict[str, float]:
    """Median milliseconds per call, the calls interleaved so that they share the machine.

    The order rotates from one round to the next: what one call leaves behind (threads
    still awake, caches) falls on each of the others in turn.
    """
    names = list(calls)
    samples = {name: [] for name in names}
    for round_ in range(repeats):
        shift = round_ % len(names)
        for name in names[shift:] + names[:shift]:
            start = time.perf_counter()
            calls[name]()
            samples[name].append(time.perf_counter() - start)
    return {name: round(statistics.median(s) * 1e3, 4) for name, s in samples.items()}


class _Runtimes:
    """Keras, the reloaded SavedModel and onnxruntime, each called on `{input name: array}`."""

    def __init__(self, model: keras.Model, saved_model_path: Path, onnx_path: Path):
        import onnxruntime

        self.specs = input_signature(model)
        # Keras runs the model as a graph traced apart from the exported one but with the
        # same dynamic axes: the same kernels, so the SavedModel's error measures what
        # saving and loading change (a graph traced per shape, or eager execution, picks
        # other kernels and differs from either by ~1e-6 of float32 rounding).
        self.keras = serving_function(model)
        self.serve = tf.saved_model.load(str(saved_model_path)).signatures["serving_default"]
        options = onnxruntime.SessionOptions()
        options.log_severity_level = 3
        # After a run onnxruntime's threads spin, waiting for the next one; interleaved
        # with TensorFlow they would take its cores and slow whichever call comes next
        # (by 3 ms, double, at batch 1 x sequence 128 on 2 cores).
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        self.session = onnxruntime.InferenceSession(
            str(onnx_path), options, providers=["CPUExecutionProvider"]
        )
        self.onnx_outputs = [o.name for o in self.session.get_outputs()]

    def calls(self, feeds: dict) -> dict[str, Callable[[], dict]]:
        """Per runtime, a call with the inputs already converted, returning `{name: output}`."""
        tensors = {name: tf.constant(value) for name, value in feeds.items()}
        ordered = [tensors[spec.name] for spec in self.specs]
        return {
            "keras": lambda: self.keras(*ordered),
            "saved_model": lambda: self.serve(**tensors),
            "onnxruntime": lambda: dict(
                zip(self.onnx_outputs, self.session.run(None, feeds), strict=True)
            ),
        }


def verify_export(
    model: keras.Model,
    saved_model_path: str | os.PathLike,
    onnx_path: str | os.PathLike,
    *,
    batch_sizes: Sequence[int] = BATCH_SIZES,
    sequence_lengths: Sequence[int] = SEQUENCE_LENGTHS,
    max_sequence_length: int | None = None,
    make_inputs: Callable[[int, int], dict[str, np.ndarray]] | None = None,
    repeats: int = 5,
    report_path: str | os.PathLike | None = None,
    progress: Callable[[str], None] | None = None,
    raise_on_failure: bool = True,
) -> dict:
    """Runs Keras, the reloaded SavedModel and onnxruntime on the same inputs and compares them.

    Shapes: every batch size with every sequence length up to the longest the model
    allows, and that longest length (`max_sequence_length`, else the smallest learned
    position table, else none). None of them is a traced shape: both artifacts were
    traced with dynamic axes. A float32 model passes when each runtime meets
    `allclose(atol=1e-5, rtol=1e-4)` against Keras; the runtimes of a float16 model,
    Keras included, are compared with its float32 twin at `atol=rtol=1e-2`. A bfloat16
    model is checked as the float32 copy that was exported (see `exportable_model`).
    Latency is the median of `repeats` calls per runtime, interleaved, after a warm-up.

    Example:

    ```python
    report = verify_export(
        model, "out/saved_model", "out/model.onnx", batch_sizes=(1, 2), sequence_lengths=(3, 17)
    )
    report["summary"]["onnxruntime"]["max_abs_error"]  # below 1e-5, or it raised
    ```

    Args:
        model: the Keras model that was exported.
        saved_model_path: the SavedModel folder `save_saved_model` wrote.
        onnx_path: the ONNX file `save_onnx` wrote.
        batch_sizes: batch sizes to check.
        sequence_lengths: sequence lengths to check (those past the longest are left out).
        max_sequence_length: the longest sequence the model allows, checked as well.
        make_inputs: `make_inputs(batch, sequence)` returns `{input name: array}`;
            default `default_inputs`.
        repeats: timed calls per runtime and shape.
        report_path: where to write the report as JSON (whole or not at all), if given.
        progress: called with a line of text after each shape.
        raise_on_failure: raise `VerificationError` (after writing the report) on failure.

    Returns:
        The report: `passed`; `cases`, per shape each runtime's `max_abs_error`,
        `max_rel_error`, `passed` and `latency_ms`; `summary`, per runtime the largest
        errors over all shapes; `sizes` (bytes of ONNX constants, of the model's weights
        and of its position tables); `tolerance`; `notes`.

    Raises:
        VerificationError: a runtime differs from Keras beyond the tolerance (with
            `raise_on_failure`); the report is written first.
    """
    saved_model_path = Path(saved_model_path)
    onnx_path = Path(onnx_path)
    if not is_saved_model(saved_model_path):
        raise FileNotFoundError(
            errno.ENOENT,
            f"No SavedModel at {str(saved_model_path)!r}; write one with save_saved_model",
            str(saved_model_path),
        )
    if not onnx_path.is_file():
        raise FileNotFoundError(
            errno.ENOENT,
            f"No ONNX file at {str(onnx_path)!r}; write one with save_onnx",
            str(onnx_path),
        )
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats must be a positive integer, got {repeats!r}.")

    with warnings.catch_warnings():  # it was said when the model was exported
        warnings.simplefilter("ignore")
        exported, notes = exportable_model(model, "float32")
    low_precision = any(_is_low_precision(d) for d in compute_dtypes(exported))
    tolerance = FLOAT16_TOLERANCE if low_precision else FLOAT32_TOLERANCE
    twin = serving_function(float32_copy(exported)) if low_precision else None
    if low_precision:
        notes.append(
            "float16 model: each runtime, Keras included, is compared with its float32 twin."
        )
    longest = max_sequence_length or longest_sequence(model)
    shapes = verification_shapes(longest, batch_sizes, sequence_lengths)
    if make_inputs is None:

        def make_inputs(batch: int, sequence: int) -> dict[str, np.ndarray]:
            return default_inputs(exported, batch, sequence, longest)

    runtimes = _Runtimes(exported, saved_model_path, onnx_path)
    compared = RUNTIMES if low_precision else RUNTIMES[1:]
    started = time.perf_counter()
    cases = []
    for batch, sequence in shapes:
        feeds = make_inputs(batch, sequence)
        calls = runtimes.calls(feeds)
        outputs = {name: _numpy(call()) for name, call in calls.items()}  # also the warm-up
        if twin is not None:
            reference = _numpy(twin(*(tf.constant(feeds[spec.name]) for spec in runtimes.specs)))
        else:
            reference = outputs["keras"]
        latencies = _median_latencies(calls, repeats)
        case = {"batch": batch, "sequence": sequence, "runtimes": {}}
        for name in RUNTIMES:
            entry = compare_outputs(outputs[name], reference, tolerance) if name in compared else {}
            case["runtimes"][name] = {**entry, "latency_ms": latencies[name]}
        case["passed"] = all(case["runtimes"][name]["passed"] for name in compared)
        cases.append(case)
        if progress is not None:
            worst = max(case["runtimes"][name]["max_abs_error"] for name in compared)
            progress(
                f"batch {batch:>2} x sequence {sequence:>4}: max abs error {worst:.1e}, "
                f"{'pass' if case['passed'] else 'FAIL'}"
            )

    summary = {}
    for name in RUNTIMES:
        entries = [case["runtimes"][name] for case in cases]
        summary[name] = (
            {
                "max_abs_error": max(e["max_abs_error"] for e in entries),
                "max_rel_error": max(e["max_rel_error"] for e in entries),
                "tolerance_used": max(e["tolerance_used"] for e in entries),
                "passed": all(e["passed"] for e in entries),
            }
            if name in compared
            else {"reference": True}
        )
    report = {
        "model": model.name,
        "passed": all(case["passed"] for case in cases),
        "saved_model": str(saved_model_path),
        "onnx": str(onnx_path),
        "reference": "keras float32 twin" if low_precision else "keras",
        "tolerance": tolerance,
        "relative_error": "max |runtime - reference| / |reference| over nonzero references",
        "tolerance_used": "max |runtime - reference| / (atol + rtol |reference|); pass <= 1",
        "longest_sequence": longest,
        "repeats": repeats,
        "seconds": round(time.perf_counter() - started, 2),
        "notes": notes,
        "sizes": {
            "onnx_constant_bytes": onnx_constant_bytes(onnx_path),
            "parameter_bytes": parameter_bytes(exported),
            "position_table_bytes": position_table_bytes(exported),
        },
        "summary": summary,
        "cases": cases,
    }
    if report_path is not None:
        write_json(report, report_path)
    if raise_on_failure and not report["passed"]:
        failed = [
            f"batch {c['batch']} x sequence {c['sequence']}" for c in cases if not c["passed"]
        ]
        raise VerificationError(
            f"The export of {model.name!r} differs from Keras beyond {tolerance} on "
            f"{len(failed)} of {len(cases)} shapes ({', '.join(failed[:3])}"
            f"{', ...' if len(failed) > 3 else ''}); see "
            + (str(report_path) if report_path is not None else "the error's report"),
            report,
        )
    return report


def _numpy(outputs: dict) -> dict[str, np.ndarray]:
    return {name: np.asarray(value) for name, value in outputs.items()}
