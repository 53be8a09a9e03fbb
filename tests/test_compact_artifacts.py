"""Compact artifacts: each position table stored once per file, and only the rows a bound reaches.

The reference sizes come from the layers' configuration, not from the code under test: a
layer of width `W` (sinusoidal) or head size `D` (RoPE) holds `CACHED` rows of `W` (one
table) or of `D` (cos and signed sin) and, for positions past them, four split tables of
`CACHED x W/2` (or `D/2`): fine and coarse sin and cos. A bound `B <= CACHED` leaves `B`
rows of the cached tables and no split tables. float32 throughout: 4 bytes a value.
"""

from __future__ import annotations

from pathlib import Path

import keras
import numpy as np
import onnx
import pytest
import reference
import runtimes
import tensorflow as tf
from float32_error import assert_within_bound, position_sum_error, rotation_error
from onnx import numpy_helper
from tensorflow.core.protobuf import saved_model_pb2

from keras_posenc import (
    LearnedPositionalEmbedding,
    RotaryEmbedding,
    RotaryMultiHeadAttention,
    SinusoidalPositionalEncoding,
    _tf,
)
from keras_posenc import export as kpe
from keras_posenc_cli import encoders

CACHED = 4096
FLOAT = 4
RATIO = 1.2
BOUND = 64


def sinusoidal_table_bytes(width: int, rows: int | None = None) -> int:
    """One copy of a sinusoidal table of `width`: `rows` rows, or the cache and the split."""
    if rows is not None:
        return rows * width * FLOAT
    return CACHED * width * FLOAT + 4 * CACHED * (width // 2) * FLOAT


def rotary_table_bytes(head: int, rows: int | None = None) -> int:
    """One copy of RoPE's cos and signed sin tables for heads of `head` channels."""
    if rows is not None:
        return 2 * rows * head * FLOAT
    return 2 * CACHED * head * FLOAT + 4 * CACHED * (head // 2) * FLOAT


def parameter_bytes(model: keras.Model) -> int:
    return model.count_params() * FLOAT


def folder_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file())


# --------------------------------------------------------------------------------------
# The float arrays each file stores (shapes), read with each format's own tools


def saved_model_arrays(path: Path) -> list[tuple[int, ...]]:
    """Shapes of the float constants in every graph of a SavedModel and of its variables."""
    proto = saved_model_pb2.SavedModel()
    proto.ParseFromString((Path(path) / "saved_model.pb").read_bytes())
    shapes = []
    graph = proto.meta_graphs[0].graph_def
    for nodes in [graph.node, *(f.node_def for f in graph.library.function)]:
        for node in nodes:
            if node.op == "Const" and node.attr["dtype"].type == tf.float32.as_datatype_enum:
                shapes.append(tuple(d.size for d in node.attr["value"].tensor.tensor_shape.dim))
    for _, shape in tf.train.list_variables(str(Path(path) / "variables" / "variables")):
        if shape:
            shapes.append(tuple(shape))
    return shapes


def onnx_arrays(path: Path) -> list[tuple[int, ...]]:
    """Shapes of the float initializers and Constant nodes of every graph of an ONNX file."""
    model = onnx.load(str(path))
    shapes = []

    def visit(graph):
        for initializer in graph.initializer:
            if initializer.data_type == onnx.TensorProto.FLOAT:
                shapes.append(tuple(initializer.dims))
        for node in graph.node:
            for attribute in node.attribute:
                if attribute.type == onnx.AttributeProto.TENSOR:
                    array = numpy_helper.to_array(attribute.t)
                    if array.dtype == np.float32:
                        shapes.append(array.shape)
                elif attribute.type == onnx.AttributeProto.GRAPH:
                    visit(attribute.g)

    visit(model.graph)
    return shapes


def litert_arrays(path: Path) -> list[tuple[int, ...]]:
    """Shapes of the float32 data buffers of a `.tflite` file (tensors may share one)."""
    from tensorflow.lite.python import schema_py_generated as schema

    model = schema.Model.GetRootAsModel(Path(path).read_bytes(), 0)
    shapes = {}
    for s in range(model.SubgraphsLength()):
        subgraph = model.Subgraphs(s)
        for t in range(subgraph.TensorsLength()):
            tensor = subgraph.Tensors(t)
            buffer = model.Buffers(tensor.Buffer())
            if tensor.Type() == schema.TensorType.FLOAT32 and buffer.DataLength() > 0:
                shape = tuple(tensor.ShapeAsNumpy()) if tensor.ShapeLength() else ()
                shapes[tensor.Buffer()] = shape
    return list(shapes.values())


def array_bytes(shapes) -> int:
    return sum(int(np.prod(shape)) * FLOAT for shape in shapes)


# --------------------------------------------------------------------------------------
# A model whose table is 10x its weights: a stack of RoPE attention layers, one table


def stacked_rotary(layers: int = 4) -> keras.Model:
    """`layers` RoPE attention layers of 2 heads of 16 on width 16, residual: one table."""
    states = keras.Input((None, 16), name="states")
    hidden = states
    for index in range(layers):
        attention = RotaryMultiHeadAttention(num_heads=2, key_dim=16, name=f"attention_{index}")
        hidden = hidden + attention(hidden, hidden)
    model = keras.Model(states, {"encoded": hidden}, name="stacked_rotary")
    encoders.seed_weights(model, 7)
    return model


@pytest.fixture(scope="module")
def stacked(tmp_path_factory):
    model = stacked_rotary()
    folder = tmp_path_factory.mktemp("stacked")
    paths = (
        kpe.save_saved_model(model, folder / "saved_model"),
        kpe.save_onnx(model, folder / "model.onnx"),
        kpe.save_litert(model, folder / "model.tflite"),
    )
    return model, paths


def test_the_stacked_model_holds_a_table_ten_times_its_weights(stacked):
    model, _ = stacked
    assert rotary_table_bytes(16) >= 10 * parameter_bytes(model)


def test_every_file_of_the_stacked_model_stores_its_weights_and_the_table_once(stacked):
    # What each file stores (its float arrays); the rest of a file is the graph itself,
    # which grows with the layers, not with the tables (see docs/export.md, "Sizes").
    model, (saved, onnx_path, litert_path) = stacked
    reference = parameter_bytes(model) + rotary_table_bytes(16)
    stored = {
        "saved_model": array_bytes(saved_model_arrays(saved)),
        "saved_model (package count)": kpe.saved_model_constant_bytes(saved),
        "onnx": array_bytes(onnx_arrays(onnx_path)),
        "litert": array_bytes(litert_arrays(litert_path)),
        "litert (package count)": kpe.litert_constant_bytes(litert_path),
    }
    for name, size in stored.items():
        assert size <= RATIO * reference, f"{name}: {size:,} B against {reference:,} B"


def test_the_stacked_model_s_onnx_and_litert_files_are_within_the_ratio_whole(stacked):
    # The whole file, graph included: ONNX shares one row lookup across the layers. (The
    # SavedModel's graph is TensorFlow's and Keras's as much as ours: docs/export.md.)
    model, (_, onnx_path, litert_path) = stacked
    reference = parameter_bytes(model) + rotary_table_bytes(16)
    for path in (onnx_path, litert_path):
        size = path.stat().st_size
        assert size <= RATIO * reference, f"{path.name}: {size:,} B against {reference:,} B"


def test_the_stacked_saved_model_holds_one_row_lookup_that_every_layer_calls(stacked):
    # The rows of a run depend on the table, the start and the length alone: one function
    # (with its choice between cached and computed rows) that each layer calls.
    model, (saved, _, _) = stacked
    proto = saved_model_pb2.SavedModel()
    proto.ParseFromString((saved / "saved_model.pb").read_bytes())
    library = proto.meta_graphs[0].graph_def.library.function
    names = [f.signature.name for f in library]
    lookups = [name for name in names if "posenc_rows_of_run" in name]
    assert len(lookups) == 1, names
    assert sum("cond_true" in name for name in names) == 1, names
    calls = [
        node
        for function in library
        for node in function.node_def
        if node.op.endswith("PartitionedCall") and node.attr["f"].func.name == lookups[0]
    ]
    layers = sum(isinstance(layer, RotaryMultiHeadAttention) for layer in model.layers)
    assert len(calls) == layers == 4


def test_the_stacked_saved_model_still_loads_with_tensorflow_alone_and_matches_keras(stacked):
    model, (saved, _, _) = stacked
    states = np.random.default_rng(0).standard_normal((2, 5, 16)).astype(np.float32)
    serve = tf.saved_model.load(str(saved)).signatures["serving_default"]
    np.testing.assert_allclose(
        serve(states=tf.constant(states))["encoded"].numpy(),
        model(states)["encoded"].numpy(),
        atol=1e-5,
    )


# --------------------------------------------------------------------------------------
# Small default encoders: the data each file stores is its weights and one copy of each table

SMALL = {
    "vocabulary_size": 50,
    "width": 16,
    "num_heads": 2,
    "num_blocks": 1,
    "feed_forward_dim": 16,
}
TABLES = {
    "sinusoidal": sinusoidal_table_bytes(16),
    "learned": 0,  # the table is a weight
    "rotary": rotary_table_bytes(8),  # heads of 16 / 2
}


@pytest.mark.parametrize("kind", list(TABLES))
def test_small_default_encoders_store_their_weights_and_each_table_once(kind, tmp_path):
    spec = encoders.EncoderSpec(
        kind, kind, max_sequence_length=BOUND if kind == "learned" else None, **SMALL
    )
    model = encoders.build_encoder(spec)
    reference = parameter_bytes(model) + TABLES[kind]
    saved = kpe.save_saved_model(model, tmp_path / "saved_model")
    onnx_path = kpe.save_onnx(model, tmp_path / "model.onnx")
    stored = {
        "saved_model": array_bytes(saved_model_arrays(saved)),
        "onnx": array_bytes(onnx_arrays(onnx_path)),
    }
    for name, size in stored.items():
        assert size <= RATIO * reference, f"{kind} {name}: {size:,} B against {reference:,} B"
    # The variables hold each weight once.
    variables = tf.train.list_variables(str(saved / "variables" / "variables"))
    stored_weights = sum(int(np.prod(shape)) for _, shape in variables if shape)
    assert stored_weights == model.count_params()


# --------------------------------------------------------------------------------------
# Bounded: max_sequence_length, a fixed length


def start_and_positions_model() -> keras.Model:
    x = keras.Input((None, 8), name="x")
    heads = keras.Input((None, 1, 8), name="heads")
    start = keras.Input(batch_shape=(), dtype="int32", name="start_index")
    positions = keras.Input((None,), dtype="int32", name="positions")
    sinusoidal, rotary = SinusoidalPositionalEncoding(), RotaryEmbedding()
    outputs = {
        "sinusoidal_start": sinusoidal(x, start_index=start),
        "rotary_start": rotary(heads, start_index=start),
        "sinusoidal_positions": sinusoidal(x, positions=positions),
        "rotary_positions": rotary(heads, positions=positions),
    }
    inputs = {"x": x, "heads": heads, "start_index": start, "positions": positions}
    return keras.Model(inputs, outputs, name="bounded")


@pytest.fixture(scope="module")
def bounded(tmp_path_factory):
    model = start_and_positions_model()
    folder = tmp_path_factory.mktemp("bounded")
    paths = (
        kpe.save_saved_model(model, folder / "saved_model", max_sequence_length=BOUND),
        kpe.save_onnx(model, folder / "model.onnx", max_sequence_length=BOUND),
        kpe.save_litert(model, folder / "model.tflite", max_sequence_length=BOUND),
    )
    return model, paths


def _reachable_rows_only(shapes, rows: int, reachable: int, name: str) -> None:
    tables = [shape for shape in shapes if len(shape) >= 2]
    assert all(shape[0] <= rows for shape in tables), f"{name}: {tables}"
    assert array_bytes(tables) <= reachable, f"{name}: {tables}"


def test_a_bounded_export_carries_only_the_rows_below_the_bound(bounded):
    _, (saved, onnx_path, litert_path) = bounded
    reachable = sinusoidal_table_bytes(8, BOUND) + rotary_table_bytes(8, BOUND)
    _reachable_rows_only(saved_model_arrays(saved), BOUND, reachable, "saved_model")
    _reachable_rows_only(onnx_arrays(onnx_path), BOUND, reachable, "onnx")
    _reachable_rows_only(litert_arrays(litert_path), BOUND, reachable, "litert")


def test_a_fixed_length_carries_only_its_rows(tmp_path):
    x = keras.Input((16, 8), name="x")
    heads = keras.Input((16, 1, 8), name="heads")
    outputs = {
        "sinusoidal": SinusoidalPositionalEncoding()(x),
        "rotary": RotaryEmbedding()(heads),
    }
    model = keras.Model({"x": x, "heads": heads}, outputs)
    reachable = sinusoidal_table_bytes(8, 16) + rotary_table_bytes(8, 16)
    saved = kpe.save_saved_model(model, tmp_path / "saved_model")
    onnx_path = kpe.save_onnx(model, tmp_path / "model.onnx")
    _reachable_rows_only(saved_model_arrays(saved), 16, reachable, "saved_model")
    _reachable_rows_only(onnx_arrays(onnx_path), 16, reachable, "onnx")


def _reference(model, feeds):
    return {k: v.numpy() for k, v in model({k: tf.constant(v) for k, v in feeds.items()}).items()}


def _feeds(start: int, positions, steps: int = 3) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(start)
    return {
        "x": rng.standard_normal((2, steps, 8)).astype(np.float32),
        "heads": rng.standard_normal((2, steps, 1, 8)).astype(np.float32),
        "start_index": np.array(start, np.int32),
        "positions": np.tile(np.array(positions, np.int32), (2, 1)),
    }


def _runners(paths):
    return runtimes.runners(*paths)


def test_a_bounded_export_matches_keras_up_to_the_bound(bounded):
    model, paths = bounded
    # The last run below the bound, from a start and as positions; and the first rows.
    for feeds in (_feeds(BOUND - 3, [BOUND - 1, 0, BOUND - 2]), _feeds(0, [0, 1, 2])):
        expected = _reference(model, feeds)
        exact, bounds = _formulas(feeds)
        for runtime, outputs in [("keras", expected)] + [
            (runtime, run(feeds)) for runtime, run in _runners(paths).items()
        ]:
            for name, value in exact.items():
                what = f"{runtime} {name}"
                assert_within_bound(outputs[name], value, bounds[name], what=what)
                # and each file within two float32 bounds of Keras's own numbers
                twice = 2 * bounds[name]
                assert_within_bound(outputs[name], expected[name], twice, what=what)


def _formulas(feeds: dict) -> tuple[dict, dict]:
    """The float64 formulas of `start_and_positions_model`'s outputs, and their float32
    bounds (a sum with a table row, a RoPE)."""
    x, heads = feeds["x"], feeds["heads"]
    start = int(feeds["start_index"])
    run = np.arange(start, start + x.shape[1])
    exact, bounds = {}, {}
    for kind, positions in (("start", run), ("positions", feeds["positions"])):
        exact[f"sinusoidal_{kind}"] = x + reference.sinusoidal(positions, x.shape[-1])
        exact[f"rotary_{kind}"] = reference.rotary(heads, positions)
        bounds[f"sinusoidal_{kind}"] = position_sum_error(x)
        bounds[f"rotary_{kind}"] = rotation_error(heads)
    return exact, bounds


@pytest.mark.parametrize(
    "bad_input, start, positions",
    [("start_index", BOUND - 2, [0, 1, 2]), ("positions", 0, [0, BOUND, 1])],
)
def test_positions_at_the_bound_raise_in_the_saved_model_and_are_nan_elsewhere(
    bounded, bad_input, start, positions
):
    _, paths = bounded
    runners = _runners(paths)
    feeds = _feeds(start, positions)
    with pytest.raises(tf.errors.InvalidArgumentError, match=f"(?s){bad_input}.*{BOUND}"):
        runners["saved_model"](feeds)
    for runtime in ("onnxruntime", "litert"):
        outputs = runners[runtime](feeds)
        source = "start" if bad_input == "start_index" else "positions"
        for kind in ("sinusoidal", "rotary"):
            assert np.isnan(outputs[f"{kind}_{source}"]).all(), (runtime, kind)
        other = "positions" if source == "start" else "start"
        assert np.isfinite(outputs[f"sinusoidal_{other}"]).all(), runtime


def test_verification_of_a_bounded_export_goes_up_to_the_bound_and_not_past_it(bounded):
    model, (saved, onnx_path, litert_path) = bounded
    report = kpe.verify_export(
        model,
        saved,
        onnx_path,
        litert_path=litert_path,
        batch_sizes=(1, 2),
        sequence_lengths=(2, 17),
        max_sequence_length=BOUND,
        repeats=1,
    )
    assert report["passed"], report["summary"]
    assert report["positions"]["limit"] == BOUND
    assert report["positions"]["covered"][-1][-1] == BOUND - 1  # the last row, none past it
    assert max(case["sequence"] for case in report["cases"]) == BOUND
    cases = kpe.verification_cases(model, (1,), (2,), BOUND)
    assert max(case.get("start_index", 0) + case["sequence"] for case in cases) == BOUND


# --------------------------------------------------------------------------------------
# The bound itself


def test_the_bound_is_max_sequence_length_else_the_smallest_learned_table():
    x = keras.Input((None, 8), name="x")
    learned = keras.Model(x, LearnedPositionalEmbedding(40)(SinusoidalPositionalEncoding()(x)))
    unbounded = keras.Model(x, SinusoidalPositionalEncoding()(x))
    assert kpe.export_bound(unbounded) is None
    assert kpe.export_bound(unbounded, 5000) == 5000
    assert kpe.export_bound(learned) == 40
    assert kpe.export_bound(learned, 16) == 16
    with pytest.raises(ValueError, match="learned position table has 40 rows"):
        kpe.export_bound(learned, 41)
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match="positive integer"):
            kpe.export_bound(unbounded, bad)
    with pytest.raises(ValueError, match="16777216"):
        kpe.export_bound(unbounded, 4096 * 4096 + 1)


def test_nothing_is_bounded_or_shared_outside_an_export():
    with pytest.raises(RuntimeError), _tf.positions_bounded(8), _tf.tables_stored_once():
        raise RuntimeError("interrupted")
    assert _tf.position_bound() is None
    layer = SinusoidalPositionalEncoding()
    x = tf.zeros((1, 5000, 8))
    traced = tf.function(lambda x: layer(x, start_index=tf.constant(3)))(x)
    # Past the bound of the interrupted export, and through the split tables: no bound left.
    # Zero inputs: the outputs are the rows, each within the float32 bound of the formula.
    exact = reference.sinusoidal(np.arange(3, 5003), 8)[None]
    bound = position_sum_error(x.numpy())
    assert_within_bound(traced.numpy(), exact, bound, what="traced")
    assert_within_bound(layer(x, start_index=3).numpy(), exact, bound, what="eager")
