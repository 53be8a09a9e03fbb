"""Audit of the position tables an artifact stores: every row, against what Keras holds.

The cases of a verification read only some rows of each table (the first, the last, a few
near the cached rows' end); a row changed in the middle would pass them. This audit
reads the stored constants of each artifact instead and compares every element with
the table the model's layers hold:

- the host tables (`PositionTable.stored_arrays(bound)`: made in float64, rounded once
  to float32) of the sinusoidal and rotary layers, of their multi-axis forms (each
  axis's split tables, `AxesRows.stored_arrays`) and of a scaling that switches tables
  by length (both tables; see `layer_tables`);
- the weights of each learned table (`LearnedPositionalEmbedding.embeddings`).

What each format stores, and how it is read:

- ONNX: initializers and `Constant` nodes of the main graph and every subgraph (the
  branches of a run-time choice), `onnx.numpy_helper.to_array`;
- LiteRT: the data buffers of every subgraph's tensors, read with their type and shape
  from the flatbuffer (or past it, at a buffer's offset, in files over 2 GiB);
- SavedModel: `Const` nodes of the graph and of every function of its library
  (`tf.make_ndarray`), and the variables of its checkpoint (learned tables).

Matching is by content: a stored tensor of a table's size (its rows first in any shape,
flat, or transposed; float32, float16, bfloat16 or float64) is a copy of the table when it
is near it (its median row within 1e-2 of the table's, relative to the table's largest
value) or when a 64th of its rows (two at least, not of one value: zeros or ones prove
nothing) equal the table's exactly; a tensor near several tables is a copy of the one it
equals, else of the nearest. A stored tensor of three or more rows, fewer than the
table's, with its columns is a run of it (the rows a trace with a known start and length
embeds) when three quarters of its rows equal a run of the table's. Shorter runs are not
audited. Every copy and every run must equal the table exactly (float32, or the stored
dtype for a lower-precision tensor): one with any row changed fails, named with its
worst row, so a tampered table is never passed because some other tensor matches. A
table stored neither whole nor as a run is listed as "not stored whole" and does not
fail by itself: an export holds only what its graph reads (a `positions` input reads the
split tables alone; a fixed sequence length, the run it uses), and a changed copy is
still a near copy, which fails. What escapes: a change of nearly every row by more than
1e-2 (the cases read such rows), and a table the graph computes from other constants.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from keras_posenc.backend import tensorflow as tf_backend
from keras_posenc.export.signature import export_bound

SPLIT_NAMES = ("fine_sin", "fine_cos", "coarse_sin", "coarse_cos")


def layer_tables(layer) -> list[tuple[str, object]]:
    """`[(prefix, table)]`: the host tables `layer` reads its rows from, each once.

    Its `position_tables()`, and the tables behind rows made otherwise, which that leaves
    out: each axis's tables of a multi-axis layer (`axes.AxesRows`), and the short and the
    long table of a scaling that switches by length (`keras_posenc.rope.SwitchByLength`,
    prefixed `short_` and `long_`; dynamic NTK rows are computed, no table).
    """
    found = [("", table) for table in getattr(layer, "position_tables", tuple)()]
    # The rows a sinusoidal or rotary layer made.
    found += _tables_of(getattr(layer, "held_rows", lambda: None)(), "")
    unique, seen = [], set()
    for prefix, table in found:
        if id(table) not in seen:
            seen.add(id(table))
            unique.append((prefix, table))
    return unique


def _tables_of(rows, prefix: str) -> list[tuple[str, object]]:
    from keras_posenc.frequencies import PositionTable
    from keras_posenc.rope import SwitchByLength
    from keras_posenc.tables.axes import AxesRows

    if isinstance(rows, PositionTable):
        return [(prefix, rows)]
    if isinstance(rows, AxesRows):
        return [(prefix, table) for table in rows.position_tables()]
    if isinstance(rows, SwitchByLength):
        return _tables_of(rows.short, prefix + "short_") + _tables_of(rows.long, prefix + "long_")
    return []


def expected_tables(model, longest: int | None) -> list[dict]:
    """`[{"table", "array", "group", "kind"}]`: every table the model's layers store.

    `table` names it (`layer/array`); `group` ties the arrays of one `PositionTable`
    together; `kind` is `"cached"`, `"split"` or `"learned"`. A table shared by several
    layers is listed once; equal arrays of different tables (the split tables of two
    layers with the same frequencies) are each listed, and one stored copy serves both.
    """
    from keras_posenc.layers.learned import LearnedPositionalEmbedding

    bound = export_bound(model, longest)
    tables, seen_tables = [], set()

    def add(name, array, group, kind):
        array = np.asarray(array)
        array = array.reshape(array.shape[0], -1) if array.ndim != 2 else array
        if array.size == 0:
            return
        tables.append({"table": name, "array": array, "group": group, "kind": kind})

    for layer in tf_backend.all_layers(model):
        for prefix, table in layer_tables(layer):
            if id(table) in seen_tables:
                continue
            seen_tables.add(id(table))
            for name, array in table.stored_arrays(bound).items():
                kind = "split" if name.endswith(SPLIT_NAMES) else "cached"
                add(f"{layer.name}/{prefix}{name}", array, id(table), kind)
        if isinstance(layer, LearnedPositionalEmbedding) and layer.built:
            weights = np.asarray(layer.embeddings.numpy())
            if np.issubdtype(weights.dtype, np.floating):
                add(f"{layer.name}/embeddings", weights, id(layer), "learned")
    return tables


# --------------------------------------------------------------------------------------
# Stored tensors, by format: [(name, array)]


def onnx_tensors(path: str | os.PathLike) -> list[tuple[str, np.ndarray]]:
    """Every initializer and `Constant` tensor of an ONNX file, all graphs."""
    import onnx
    from onnx import numpy_helper

    from keras_posenc.export.onnx_passes.graph import graphs

    proto = onnx.load(str(path))
    found = []
    for graph in graphs(proto.graph):
        for initializer in graph.initializer:
            found.append((initializer.name, numpy_helper.to_array(initializer)))
        for node in graph.node:
            for attribute in node.attribute:
                if attribute.type == onnx.AttributeProto.TENSOR:
                    found.append((node.name or node.output[0], numpy_helper.to_array(attribute.t)))
    return found


def litert_tensors(path: str | os.PathLike) -> list[tuple[str, np.ndarray]]:
    """Every float tensor with data in a `.tflite` file, each buffer once."""
    schema = tf_backend.tflite_schema()
    content = Path(path).read_bytes()
    model = schema.Model.GetRootAsModel(content, 0)
    dtypes = {schema.TensorType.FLOAT32: np.float32, schema.TensorType.FLOAT16: np.float16}
    found, seen = [], set()
    for s in range(model.SubgraphsLength()):
        subgraph = model.Subgraphs(s)
        for t in range(subgraph.TensorsLength()):
            tensor = subgraph.Tensors(t)
            dtype = dtypes.get(tensor.Type())
            if dtype is None or tensor.Buffer() in seen:
                continue
            buffer = model.Buffers(tensor.Buffer())
            if buffer.DataLength():
                data = buffer.DataAsNumpy().tobytes()
            elif buffer.Offset() > 1 and buffer.Size():  # past the flatbuffer (> 2 GiB)
                data = content[buffer.Offset() : buffer.Offset() + buffer.Size()]
            else:
                continue
            seen.add(tensor.Buffer())
            array = np.frombuffer(data, dtype=dtype)
            shape = tuple(int(d) for d in tensor.ShapeAsNumpy()) if tensor.ShapeLength() else ()
            if int(np.prod(shape)) == array.size:
                array = array.reshape(shape)
            found.append((tensor.Name().decode(errors="replace"), array))
    return found


def saved_model_tensors(path: str | os.PathLike) -> list[tuple[str, np.ndarray]]:
    """Every `Const` of a SavedModel's graphs and functions, and every checkpoint variable."""
    import tensorflow as tf

    path = Path(path)
    found = []
    for graph in tf_backend.saved_model_proto(path).meta_graphs:
        functions = [("", graph.graph_def.node)]
        functions += [
            (f.signature.name + "/", f.node_def) for f in graph.graph_def.library.function
        ]
        for prefix, nodes in functions:
            for node in nodes:
                if node.op == "Const":
                    found.append((prefix + node.name, tf.make_ndarray(node.attr["value"].tensor)))
    if (path / "variables" / "variables.index").is_file():
        reader = tf.train.load_checkpoint(str(path / "variables" / "variables"))
        for name, dtype in reader.get_variable_to_dtype_map().items():
            if dtype.is_floating:
                found.append((name, np.asarray(reader.get_tensor(name))))
    return found


READERS = {
    "onnxruntime": onnx_tensors,
    "litert": litert_tensors,
    "saved_model": saved_model_tensors,
}


# --------------------------------------------------------------------------------------
# The audit


def _is_float(array: np.ndarray) -> bool:
    """numpy's floats, and bfloat16 (ml_dtypes', which numpy does not count as floating)."""
    return np.issubdtype(array.dtype, np.floating) or array.dtype.name == "bfloat16"


def _as_tables(stored: np.ndarray, expected: np.ndarray) -> list[np.ndarray]:
    """`stored` as `(rows, columns)` of `expected`, each way it can hold the table: its rows
    first (any shape of the table's size, flat included), or transposed."""
    if stored.size != expected.size or stored.ndim == 0 or not _is_float(stored):
        return []
    rows, columns = expected.shape
    ways = []
    if stored.ndim == 1 or stored.shape[0] == rows:
        ways.append(stored.reshape(rows, columns))
    if stored.ndim == 2 and stored.shape == (columns, rows) and rows != columns:
        ways.append(stored.T)
    return ways


def _compare(stored: np.ndarray, expected: np.ndarray) -> dict:
    """Rows equal, the worst row and its error, of a stored tensor against a table."""
    want = expected.astype(stored.dtype)  # float16 tensors against the table in float16
    equal = np.all(stored == want, axis=1)
    want = want.astype(np.float64)
    errors = np.max(np.abs(stored.astype(np.float64) - want), axis=1)
    errors = np.where(np.isnan(errors), np.inf, errors)
    worst = int(np.argmax(errors))
    varied = np.ptp(want, axis=1) > 0  # rows of one value (zeros, ones) prove nothing
    return {
        "rows_equal": int(equal.sum()),
        "varied_equal": int((equal & varied).sum()),
        "varied": int(varied.sum()),
        "median_row_error": float(np.median(errors)),
        "worst_row": worst,
        "max_abs_error": float(errors[worst]),
    }


# A stored tensor of a table's size is a copy of it (and must then equal it exactly) when
# it is near the table (its median row within NEAR of the table's, relative to the
# table's largest value), or when a 64th of its rows (two at least, not of one value)
# equal the table's exactly: no other tensor shares rows exactly, and a change that
# leaves neither is one of most rows by far more than NEAR, which the cases read.
NEAR = 1e-2
EQUAL_ROWS = 64


def _is_copy(result: dict, expected: np.ndarray) -> bool:
    scale = max(1.0, float(np.max(np.abs(expected))))
    rows = expected.shape[0]
    if result["median_row_error"] <= NEAR * scale:
        return True
    wanted = min(max(2, -(-rows // EQUAL_ROWS)), result["varied"])
    return result["varied_equal"] >= max(wanted, 1) and result["rows_equal"] >= wanted


def _slice_copies(stored: np.ndarray, expected: np.ndarray) -> list[tuple[int, dict]]:
    """`[(first row, comparison)]` where `stored` is a run of `expected`'s rows (three or
    more and fewer than the table's, same columns, three quarters of them equal, two of
    those not of one value): the rows a trace with a known start and length embeds
    instead of the whole table."""
    if not _is_float(stored) or stored.ndim == 0:
        return []
    rows, columns = expected.shape
    if stored.shape[0] < 3 or stored.shape[0] >= rows or stored.size != stored.shape[0] * columns:
        return []
    run = stored.reshape(stored.shape[0], columns)
    want = expected.astype(run.dtype)
    offsets = set()
    for k in (0, 1, run.shape[0] - 1):  # an offset from any of three rows: one may be changed
        offsets.update((np.flatnonzero(np.all(want == run[k], axis=1)) - k)[:8].tolist())
    found = []
    for first in sorted(o for o in offsets if 0 <= o <= rows - run.shape[0]):
        result = _compare(run, expected[first : first + run.shape[0]])
        if 4 * result["rows_equal"] >= 3 * run.shape[0] and result["varied_equal"] >= 2:
            result["worst_row"] += first
            found.append((first, result))
    return found[:1]


def _copies(tables: list[dict], stored: list[tuple[str, np.ndarray]]) -> list[list[tuple]]:
    """Per table, `[(name, comparison)]` of the stored tensors that are copies of it.

    A tensor near several tables (layers whose tables differ a little) is a copy of the
    ones it equals, else of the nearest (of each, for equal tables).
    """
    copies = [[] for _ in tables]
    for name, array in stored:
        matches = []
        for index, table in enumerate(tables):
            for candidate in _as_tables(array, table["array"]):
                result = _compare(candidate, table["array"])
                if _is_copy(result, table["array"]):
                    matches.append((result["rows_equal"] == table["rows"], result, index))
                    break
        if not matches:
            continue
        exact = [m for m in matches if m[0]]
        if not exact:  # the nearest, each of several equal tables (two axes alike)
            closeness = [(m[1]["rows_equal"], -m[1]["median_row_error"]) for m in matches]
            exact = [m for m, c in zip(matches, closeness, strict=True) if c == max(closeness)]
        for _, result, index in exact:
            copies[index].append((name, result))
    return copies


def audit_tensors(tables: list[dict], stored: list[tuple[str, np.ndarray]]) -> dict:
    """The audit of one artifact: `{"passed", "tables": [...], "not_stored_whole"}`.

    One entry a table: `table`, `rows`, `stored_as` (the names of its copies), `passed`,
    and where it failed `reason`, `worst_row`, `max_abs_error` (of the worst copy); a
    table found neither whole nor as a run has the `reason` "not stored whole" and is
    also named in `not_stored_whole`.
    """
    tables = [{**table, "rows": table["array"].shape[0]} for table in tables]
    entries = []
    for table, copies in zip(tables, _copies(tables, stored), strict=True):
        expected, rows = table["array"], table["rows"]
        slices = []
        for name, array in stored:
            for first, result in _slice_copies(array, expected):
                slices.append(
                    (f"{name} (rows {first}..{first + len(array) - 1})", result, len(array))
                )
        entry = {"table": table["table"], "rows": rows, "stored_as": [n for n, _ in copies]}
        if slices:
            entry["slices"] = [n for n, _, _ in slices]
        checked = [(n, r, rows) for n, r in copies] + slices
        bad = [(n, r) for n, r, size in checked if r["rows_equal"] < size]
        if bad:
            name, result = max(bad, key=lambda c: c[1]["max_abs_error"])
            entry.update(
                passed=False,
                reason=f"rows differ from the table in {name}",
                worst_row=result["worst_row"],
                max_abs_error=result["max_abs_error"],
            )
        elif not copies:
            # Not a failure by itself: an export holds only what its graph reads (rows a
            # known run uses; the split tables alone for gathered positions). A changed
            # copy is never absent: it is a near copy, and fails above.
            entry.update(passed=True, reason="not stored whole")
        else:
            entry["passed"] = True
        entries.append(entry)
    return {
        "passed": all(e["passed"] for e in entries),
        "tables": entries,
        "not_stored_whole": [e["table"] for e in entries if e.get("reason") == "not stored whole"],
    }


def audit_tables(model, paths: dict[str, Path], longest: int | None) -> dict:
    """`{runtime: audit}` for each artifact of `paths` (see `audit_tensors`)."""
    tables = expected_tables(model, longest)
    if not tables:
        return {}
    return {name: audit_tensors(tables, READERS[name](path)) for name, path in paths.items()}


def failed_tables(audits: dict) -> list[str]:
    """`runtime: table (reason, worst row N)` for each table that failed."""
    lines = []
    for runtime, audit in audits.items():
        for entry in audit["tables"]:
            if not entry["passed"]:
                where = f", worst row {entry['worst_row']}" if "worst_row" in entry else ""
                lines.append(f"{runtime}: {entry['table']} ({entry['reason']}{where})")
    return lines


def unaudited_tables(audits: dict) -> list[str]:
    """One note per artifact with tables the audit found neither whole nor as a run."""
    return [
        f"{runtime}: not stored whole, so not audited row by row: "
        f"{', '.join(audit['not_stored_whole'])} (an export holds only the rows its graph "
        "reads; the cases still compare what it computes from them)"
        for runtime, audit in audits.items()
        if audit.get("not_stored_whole")
    ]
