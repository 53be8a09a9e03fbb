"""The audit of every stored table row (`keras_posenc.export.verify.tables`).

Three tiny models with a `start_index` input (RoPE, sinusoidal, learned), each exported
to ONNX, LiteRT and a SavedModel once. Every stored table of every artifact is changed
by 1e-3 in one row at its start, its middle and its end (in the ONNX initializer, in the
LiteRT flatbuffer's bytes at the tensor's buffer, in the SavedModel's constant or
checkpoint variable), and the audit must fail naming that table; `verify_export` too,
for a row in the middle that no case reads. The tables are those the layers hold
(a learned table: its trained weights).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import keras
import numpy as np
import onnx
import pytest
import tensorflow as tf
from onnx import numpy_helper

from keras_posenc import LearnedPositionalEmbedding, RotaryEmbedding, SinusoidalPositionalEncoding
from keras_posenc import export as kpe
from keras_posenc.backend import tensorflow as tf_backend
from keras_posenc.export.verify import tables as audit

WIDTH, LEARNED_LENGTH = 4, 64
GRID = {"batch_sizes": (1,), "sequence_lengths": (2,), "repeats": 1}
KINDS = ("rotary", "sinusoidal", "learned")
FORMATS = ("onnxruntime", "litert", "saved_model")


def _model(kind: str) -> keras.Model:
    keras.utils.set_random_seed(7)
    x = keras.Input((None, 1, WIDTH) if kind == "rotary" else (None, WIDTH), name="x")
    start = keras.Input(batch_shape=(), dtype="int32", name="start_index")
    layer = {
        "rotary": lambda: RotaryEmbedding(name="rope"),
        "sinusoidal": lambda: SinusoidalPositionalEncoding(name="sines"),
        "learned": lambda: LearnedPositionalEmbedding(LEARNED_LENGTH, name="learned"),
    }[kind]()
    return keras.Model({"x": x, "start_index": start}, {"y": layer(x, start_index=start)})


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """`{kind: (model, {runtime: path})}`, each model exported once to every format."""
    folder = tmp_path_factory.mktemp("tables")
    result = {}
    for kind in KINDS:
        model = _model(kind)
        result[kind] = (
            model,
            {
                "onnxruntime": kpe.save_onnx(model, folder / f"{kind}.onnx"),
                "litert": kpe.save_litert(model, folder / f"{kind}.tflite"),
                "saved_model": kpe.save_saved_model(model, folder / f"{kind}_saved_model"),
            },
        )
    return result


# --- tampering, one format each: `row` of the stored tensor `name` += 1e-3 -----------


def _onnx_tampered(path: Path, name: str, row: int, out: Path) -> Path:
    proto = onnx.load(str(path))
    from keras_posenc.export.onnx_passes.graph import graphs

    for graph in graphs(proto.graph):
        for initializer in graph.initializer:
            if initializer.name == name:
                values = numpy_helper.to_array(initializer).copy()
                values.reshape(values.shape[0], -1)[row] += np.float32(1e-3)
                initializer.CopyFrom(numpy_helper.from_array(values, name))
                onnx.save(proto, str(out))
                return out
    raise AssertionError(f"no initializer {name}")


def _litert_tampered(path: Path, name: str, row: int, out: Path) -> Path:
    import flatbuffers

    content = bytearray(path.read_bytes())
    schema = tf_backend.tflite_schema()
    model = schema.Model.GetRootAsModel(bytes(content), 0)
    for s in range(model.SubgraphsLength()):
        subgraph = model.Subgraphs(s)
        for t in range(subgraph.TensorsLength()):
            tensor = subgraph.Tensors(t)
            buffer = model.Buffers(tensor.Buffer())
            if tensor.Name().decode() != name or not buffer.DataLength():
                continue
            field = flatbuffers.number_types.UOffsetTFlags.py_type(buffer._tab.Offset(4))
            start = buffer._tab.Vector(field)  # the data's first byte in the file
            shape = tensor.ShapeAsNumpy()
            columns = int(np.prod(shape[1:]))
            values = np.frombuffer(content, np.float32, columns, start + 4 * row * columns)
            content[start + 4 * row * columns : start + 4 * (row + 1) * columns] = (
                values + np.float32(1e-3)
            ).tobytes()
            out.write_bytes(bytes(content))
            return out
    raise AssertionError(f"no tensor {name}")


def _saved_model_tampered(path: Path, name: str, row: int, out: Path) -> Path:
    shutil.copytree(path, out)
    proto = tf_backend.saved_model_proto(out)
    for graph in proto.meta_graphs:
        functions = [("", graph.graph_def.node)]
        functions += [
            (f.signature.name + "/", f.node_def) for f in graph.graph_def.library.function
        ]
        for prefix, nodes in functions:
            for node in nodes:
                if node.op == "Const" and prefix + node.name == name:
                    values = tf.make_ndarray(node.attr["value"].tensor).copy()
                    values.reshape(values.shape[0], -1)[row] += np.float32(1e-3)
                    node.attr["value"].tensor.CopyFrom(tf.make_tensor_proto(values))
                    (out / "saved_model.pb").write_bytes(proto.SerializeToString())
                    return out
    # a variable: the checkpoint rewritten under the same keys
    prefix = str(out / "variables" / "variables")
    reader = tf.train.load_checkpoint(prefix)
    names = sorted(reader.get_variable_to_shape_map())
    assert name in names, name
    tensors = []
    for key in names:
        value = reader.get_tensor(key)
        if key == name:
            value = value.copy()
            value.reshape(value.shape[0], -1)[row] += np.float32(1e-3)
        tensors.append(tf.constant(value))
    for stale in (out / "variables").glob("variables.*"):
        stale.unlink()
    tf.raw_ops.SaveV2(
        prefix=prefix, tensor_names=names, shape_and_slices=[""] * len(names), tensors=tensors
    )
    return out


TAMPER = {
    "onnxruntime": _onnx_tampered,
    "litert": _litert_tampered,
    "saved_model": _saved_model_tampered,
}
SUFFIX = {"onnxruntime": ".onnx", "litert": ".tflite", "saved_model": ""}


def _audit(model, runtime, path) -> dict:
    return audit.audit_tables(model, {runtime: Path(path)}, None)[runtime]


# --- the tests ---------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_every_table_is_found_exactly_in_every_format(exported, kind):
    model, paths = exported[kind]
    names = {t["table"] for t in audit.expected_tables(model, None)}
    wanted = {
        "rotary": {f"rope/{n}" for n in ("cached_0", "cached_1", *audit.SPLIT_NAMES)},
        "sinusoidal": {f"sines/{n}" for n in ("cached_0", *audit.SPLIT_NAMES)},
        "learned": {"learned/embeddings"},
    }[kind]
    assert names == wanted
    for runtime, path in paths.items():
        result = _audit(model, runtime, path)
        assert result["passed"], (runtime, result)
        assert all(entry["stored_as"] for entry in result["tables"]), (runtime, result)


@pytest.mark.parametrize("runtime", FORMATS)
@pytest.mark.parametrize("kind", KINDS)
def test_a_row_changed_at_the_start_middle_or_end_of_any_table_fails(
    exported, kind, runtime, tmp_path
):
    model, paths = exported[kind]
    clean = _audit(model, runtime, paths[runtime])
    for entry in clean["tables"]:
        stored_as = entry["stored_as"][0]
        for row in (0, entry["rows"] // 2, entry["rows"] - 1):
            out = tmp_path / f"{len(list(tmp_path.iterdir()))}{SUFFIX[runtime]}"
            tampered = TAMPER[runtime](Path(paths[runtime]), stored_as, row, out)
            result = _audit(model, runtime, tampered)
            assert not result["passed"], (entry["table"], row)
            (failed,) = [e for e in result["tables"] if not e["passed"]]
            assert failed["table"] == entry["table"]
            assert failed["worst_row"] == row
            assert failed["max_abs_error"] == pytest.approx(1e-3, rel=1e-2)


@pytest.mark.parametrize("runtime", FORMATS)
def test_verify_export_fails_on_the_middle_of_the_cached_rows(exported, runtime, tmp_path):
    # The row 2048: no case reads it, the audit does.
    model, paths = exported["rotary"]
    report = kpe.verify_export(model, **{_argument(runtime): paths[runtime]}, **GRID)
    assert report["passed"] and report["tables"][runtime]["passed"]
    entry = next(e for e in report["tables"][runtime]["tables"] if e["table"] == "rope/cached_0")
    tampered = TAMPER[runtime](
        Path(paths[runtime]), entry["stored_as"][0], 2048, tmp_path / f"t{SUFFIX[runtime]}"
    )
    with pytest.raises(kpe.VerificationError, match="rope/cached_0") as raised:
        kpe.verify_export(model, **{_argument(runtime): tampered}, **GRID)
    report = raised.value.report
    assert all(case["passed"] for case in report["cases"])  # the cases alone would pass
    (failed,) = [e for e in report["tables"][runtime]["tables"] if not e["passed"]]
    assert failed["table"] == "rope/cached_0" and failed["worst_row"] == 2048


def _argument(runtime: str) -> str:
    return {"onnxruntime": "onnx_path", "litert": "litert_path", "saved_model": "saved_model_path"}[
        runtime
    ]


def test_runs_of_rows_are_audited_and_an_absent_table_is_listed():
    expected = audit.expected_tables(_model("rotary"), None)
    cached = expected[0]["array"]
    run = cached[100:117].copy()
    result = audit.audit_tensors(expected[:1], [("run", run)])
    assert result["passed"]
    assert result["tables"][0]["slices"] == ["run (rows 100..116)"]
    run[8] += np.float32(1e-3)
    result = audit.audit_tensors(expected[:1], [("run", run)])
    assert not result["passed"] and result["tables"][0]["worst_row"] == 108
    # an absent table, or another tensor of its shape, is no copy: listed, not failed
    other = np.random.default_rng(0).standard_normal(cached.shape).astype(np.float32)
    result = audit.audit_tensors(expected[:1], [("w", other)])
    assert result["passed"] and result["tables"][0]["reason"] == "not stored whole"
    assert result["tables"][0]["stored_as"] == []


# --- multi-axis layers: the split tables of every axis ---------------------------------


def _multi_axis_model(kind: str) -> keras.Model:
    keras.utils.set_random_seed(7)
    if kind == "sinusoidal_axes":
        x = keras.Input((None, 2 * WIDTH), name="x")
        layer, axes = SinusoidalPositionalEncoding(axes=2, name="sines"), 2
    else:  # M-RoPE: each axis its own frequencies, so its own tables
        x = keras.Input((None, 1, 2 * WIDTH), name="x")
        layer, axes = RotaryEmbedding(mrope_section=(1, 1, 2), name="rope"), 3
    positions = keras.Input((None, axes), dtype="int32", name="positions")
    return keras.Model({"x": x, "positions": positions}, {"y": layer(x, positions=positions)})


@pytest.mark.parametrize(
    "kind, formats", [("mrope", FORMATS), ("sinusoidal_axes", ("onnxruntime",))]
)
def test_the_tables_of_every_axis_are_audited_and_a_changed_row_fails(kind, formats, tmp_path):
    model = _multi_axis_model(kind)
    axes = 3 if kind == "mrope" else 2
    names = {t["table"] for t in audit.expected_tables(model, None)}
    layer = "rope" if kind == "mrope" else "sines"
    assert names == {f"{layer}/axis{a}_{n}" for a in range(axes) for n in audit.SPLIT_NAMES}
    save = {
        "onnxruntime": lambda: kpe.save_onnx(model, tmp_path / "m.onnx"),
        "litert": lambda: kpe.save_litert(model, tmp_path / "m.tflite"),
        "saved_model": lambda: kpe.save_saved_model(model, tmp_path / "m_saved_model"),
    }
    for runtime in formats:
        path = Path(save[runtime]())
        clean = _audit(model, runtime, path)
        assert clean["passed"] and all(e["stored_as"] for e in clean["tables"]), clean
        for entry in clean["tables"]:
            if not entry["table"].endswith("0_fine_sin") and "coarse_cos" not in entry["table"]:
                continue  # one fine and every coarse table keeps the test short
            row = entry["rows"] // 2
            out = tmp_path / f"{len(list(tmp_path.iterdir()))}{SUFFIX[runtime]}"
            tampered = TAMPER[runtime](path, entry["stored_as"][0], row, out)
            result = _audit(model, runtime, tampered)
            failed = [e for e in result["tables"] if not e["passed"]]
            assert entry["table"] in {e["table"] for e in failed}, (runtime, entry)
            assert all(e["worst_row"] == row for e in failed)


def test_verify_export_lists_the_tables_an_artifact_does_not_store_whole(tmp_path):
    # Gathered positions read the split tables alone: the cached rows are in no file.
    keras.utils.set_random_seed(7)
    x = keras.Input((None, 1, WIDTH), name="x")
    positions = keras.Input((None,), dtype="int32", name="positions")
    model = keras.Model(
        {"x": x, "positions": positions},
        {"y": RotaryEmbedding(name="rope")(x, positions=positions)},
    )
    path = kpe.save_onnx(model, tmp_path / "positions.onnx")
    report = kpe.verify_export(model, onnx_path=path, **GRID)
    audited = report["tables"]["onnxruntime"]
    assert audited["passed"]
    assert audited["not_stored_whole"] == ["rope/cached_0", "rope/cached_1"]
    for name in audited["not_stored_whole"]:
        (entry,) = [e for e in audited["tables"] if e["table"] == name]
        assert entry["reason"] == "not stored whole" and entry["stored_as"] == []
    (note,) = [n for n in report["notes"] if "not stored whole" in n]
    assert note.startswith("onnxruntime:") and "rope/cached_0, rope/cached_1" in note
    split = [e for e in audited["tables"] if e["table"] not in audited["not_stored_whole"]]
    assert {e["table"] for e in split} == {f"rope/{n}" for n in audit.SPLIT_NAMES}
    assert all(e["stored_as"] for e in split)


def _cached_table():
    (table,) = [
        t for t in audit.expected_tables(_model("rotary"), None) if "cached_0" in t["table"]
    ]
    return table


def _changed(array, rows):
    array = array.copy()
    array[rows] += np.float32(1e-3)
    return array


@pytest.mark.parametrize(
    "stored",
    [
        lambda a: _changed(a, slice(511, 3585)),  # more than half the rows, none a case reads
        lambda a: a * np.float32(1.001),  # every row
        lambda a: _changed(a, 2048).reshape(-1),  # flat, reshaped in the graph
        lambda a: np.ascontiguousarray(_changed(a, 2048).T),  # transposed in the graph
        lambda a: _changed(a, 2048).astype("bfloat16"),  # cast in the graph
    ],
    ids=["most-rows", "every-row", "flat", "transposed", "bfloat16"],
)
def test_a_changed_table_stored_in_any_shape_or_dtype_fails(stored):
    table = _cached_table()
    assert audit.audit_tensors([table], [("t", table["array"].reshape(-1))])["passed"]
    result = audit.audit_tensors([table], [("t", stored(table["array"]))])
    assert not result["passed"], result
    assert result["tables"][0]["max_abs_error"] >= 5e-4


def test_tables_that_differ_a_little_are_each_matched_with_their_own_copy():
    # Two RoPE tables a wavelength 1 apart: each copy is near both, and equal to one.
    keras.utils.set_random_seed(7)
    x = keras.Input((None, 1, WIDTH), name="x")
    y = RotaryEmbedding(max_wavelength=10_001, name="b")(RotaryEmbedding(name="a")(x))
    tables = audit.expected_tables(keras.Model(x, y), None)
    stored = [(f"copy of {t['table']}", t["array"]) for t in tables]
    result = audit.audit_tensors(tables, stored)
    assert result["passed"], [e for e in result["tables"] if not e["passed"]]
    assert [e["stored_as"] for e in result["tables"]] == [[n] for n, _ in stored]


def test_the_short_and_long_tables_of_a_scaling_that_switches_by_length_are_audited(tmp_path):
    # longrope: rows of one table up to the original length, of another past it.
    keras.utils.set_random_seed(7)
    scaling = {
        "rope_type": "longrope",
        "short_factor": [1.0, 1.1],
        "long_factor": [1.5, 2.0],
        "original_max_position_embeddings": 64,
        "max_position_embeddings": 256,
    }
    x = keras.Input((None, 1, WIDTH), name="x")
    start = keras.Input(batch_shape=(), dtype="int32", name="start_index")
    layer = RotaryEmbedding(scaling=scaling, name="rope")
    model = keras.Model({"x": x, "start_index": start}, {"y": layer(x, start_index=start)})
    names = {t["table"] for t in audit.expected_tables(model, None)}
    tables = ("cached_0", "cached_1", *audit.SPLIT_NAMES)
    assert names == {f"rope/{kind}_{n}" for kind in ("short", "long") for n in tables}
    path = kpe.save_onnx(model, tmp_path / "longrope.onnx")
    clean = _audit(model, "onnxruntime", path)
    assert clean["passed"] and all(e["stored_as"] for e in clean["tables"]), clean
    entry = next(e for e in clean["tables"] if e["table"] == "rope/long_cached_0")
    tampered = _onnx_tampered(path, entry["stored_as"][0], 2048, tmp_path / "t.onnx")
    result = _audit(model, "onnxruntime", tampered)
    failed = [e for e in result["tables"] if not e["passed"]]
    assert [(e["table"], e["worst_row"]) for e in failed] == [("rope/long_cached_0", 2048)]
