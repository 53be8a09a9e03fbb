"""`python -m benchmarks.tied_head`: a tied head's MatMul in onnxruntime, by the table's layout.

A decoder's head is `x (1, 1, width) @ W (width, vocabulary)`; with tied embeddings the
same table is the embedding, read by a `Gather`. onnxruntime prepacks a MatMul's constant B
(`MlasGemmPackB`) at session start; the question is which layouts of a table stored once
still get that, and what each costs per call. One-node/two-node graphs, each output
computed from the same random table:

- `untied`: the builder's layout, two copies: `Gather(E (vocab, width))` and `MatMul(x, W)`;
- `alone`: `MatMul(x, W)` only (no embedding): W read by one node;
- `tied_columns`: the package's tied layout before the change: W `(width, vocab)` read by
  `MatMul` and by `Gather(axis=1)` + `Transpose` (the embedding as W's columns);
- `tied_rows_gemm`: the table `(vocab, width)` once, read by `Gather` (axis 0) and by
  `Gemm(transB=1)` over the flattened `x`;
- `tied_rows_matmul`: the table `(vocab, width)` once, `Gather` and `MatMul(x,
  Transpose(T))`: onnxruntime constant-folds the Transpose into a second copy;
- `control`: `untied` again, in a session of its own (the ratio's noise).

Timing: one process, every session at 1 intra-op thread, interleaved in a random order per
round; the table holds medians (ms) and the median of per-round ratios to `untied`.
Memory: each graph's session made in a fresh process (`VmHWM` and `VmRSS` after the first
run, above the process before the session).

    python -m benchmarks.tied_head --rounds 200
    python -m benchmarks.tied_head --embedding --vocabulary 128256 --rounds 2000
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

LAYOUTS = ("untied", "alone", "tied_columns", "tied_rows_gemm", "tied_rows_matmul")
# A second session of `untied.onnx`: the same work in another session, whose ratio to
# `untied` is what the placement of a session's buffers alone makes of a ratio.
TIMED = (*LAYOUTS, "control")


def _status(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(field)


def graph(layout: str, width: int, vocabulary: int):
    """The ONNX model of `layout`, outputs `embedded` (where it has one) and `logits`."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    table = rng.standard_normal((vocabulary, width), dtype=np.float32)  # (vocab, width)
    nodes, initializers = [], []
    if layout in ("untied", "alone", "tied_columns"):
        initializers.append(numpy_helper.from_array(np.ascontiguousarray(table.T), "W"))
        nodes.append(helper.make_node("MatMul", ["x", "W"], ["logits"]))
    if layout == "untied":
        initializers.append(numpy_helper.from_array(table, "E"))
        nodes.append(helper.make_node("Gather", ["E", "ids"], ["embedded"]))
    if layout == "tied_columns":
        nodes.append(helper.make_node("Gather", ["W", "ids"], ["columns"], axis=1))
        nodes.append(helper.make_node("Transpose", ["columns"], ["embedded"], perm=[1, 2, 0]))
    if layout.startswith("tied_rows"):
        initializers.append(numpy_helper.from_array(table, "T"))
        nodes.append(helper.make_node("Gather", ["T", "ids"], ["embedded"]))
    if layout == "tied_rows_gemm":
        shape = numpy_helper.from_array(np.array([1, width], np.int64), "flat")
        back = numpy_helper.from_array(np.array([1, 1, vocabulary], np.int64), "back")
        initializers += [shape, back]
        nodes.append(helper.make_node("Reshape", ["x", "flat"], ["x2"]))
        nodes.append(helper.make_node("Gemm", ["x2", "T"], ["flat_logits"], transB=1))
        nodes.append(helper.make_node("Reshape", ["flat_logits", "back"], ["logits"]))
    if layout == "tied_rows_matmul":
        nodes.append(helper.make_node("Transpose", ["T"], ["T_t"], perm=[1, 0]))
        nodes.append(helper.make_node("MatMul", ["x", "T_t"], ["logits"]))
    f32, i64 = TensorProto.FLOAT, TensorProto.INT64
    inputs = [helper.make_tensor_value_info("x", f32, [1, 1, width])]
    outputs = [helper.make_tensor_value_info("logits", f32, [1, 1, vocabulary])]
    if layout != "alone":
        inputs.append(helper.make_tensor_value_info("ids", i64, [1, 1]))
        outputs.append(helper.make_tensor_value_info("embedded", f32, [1, 1, width]))
    model = helper.make_model(
        helper.make_graph(nodes, layout, inputs, outputs, initializers),
        opset_imports=[helper.make_opsetid("", 21)],
    )
    model.ir_version = 10
    onnx.checker.check_model(model)
    return model, table


PREPACK = True  # False: `session.disable_prepacking` (a control: what prepacking is worth)


def session(path: Path):
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    if not PREPACK:
        options.add_session_config_entry("session.disable_prepacking", "1")
    return onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def feeds(layout: str, width: int) -> dict:
    x = np.random.default_rng(1).standard_normal((1, 1, width), dtype=np.float32)
    return {"x": x} if layout == "alone" else {"x": x, "ids": np.array([[5]], np.int64)}


def memory(path: Path, layout: str, width: int) -> dict:
    """Run in a fresh process: resident memory of one session above the process before it."""
    import onnxruntime  # noqa: F401  (its own memory is not the session's)

    before = _status("VmRSS")
    s = session(path)
    s.run(None, feeds(layout, width))
    return {"rss": _status("VmRSS") - before, "hwm": _status("VmHWM") - before}


def timings(folder: Path, width: int, vocabulary: int, rounds: int) -> list[dict]:
    sessions = {}
    for layout in TIMED:
        sessions[layout] = session(folder / f"{'untied' if layout == 'control' else layout}.onnx")
    inputs = {layout: feeds("untied" if layout == "control" else layout, width) for layout in TIMED}
    # Each layout computes the same logits (and the same embedded row) from the same table.
    reference = None
    for layout, s in sessions.items():
        out = dict(zip([o.name for o in s.get_outputs()], s.run(None, inputs[layout]), strict=True))
        if reference is None:
            reference = out
        assert np.allclose(out["logits"], reference["logits"], rtol=1e-4, atol=1e-3), layout
        if "embedded" in out:
            assert np.array_equal(out["embedded"], reference["embedded"]), layout
    for _ in range(5):
        for layout, s in sessions.items():
            s.run(None, inputs[layout])
    times = {layout: [] for layout in TIMED}
    rng = random.Random(0)
    for _ in range(rounds):
        for layout in rng.sample(TIMED, len(TIMED)):
            start = time.perf_counter()
            sessions[layout].run(None, inputs[layout])
            times[layout].append(time.perf_counter() - start)
    rows = []
    for layout in TIMED:
        ratios = [a / b for a, b in zip(times[layout], times["untied"], strict=True)]
        rows.append(
            {
                "layout": layout,
                "ms": 1000 * statistics.median(times[layout]),
                "ratio_to_untied": statistics.median(ratios),
            }
        )
    return rows


def embedding_timings(folder: Path, width: int, vocabulary: int, rounds: int) -> dict:
    """The embedding alone: `Gather` of a row of the `(vocab, width)` table, against
    `Gather(axis=1)` of a column of the `(width, vocab)` table and the `Transpose` after it
    (a row per token; the weights in a .data file, which onnxruntime maps: only the pages a
    Gather reads are resident). `rows_again`: the first graph in a second session."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    table = np.random.default_rng(0).standard_normal((vocabulary, width), dtype=np.float32)
    f32, i64 = TensorProto.FLOAT, TensorProto.INT64
    for name, stored, gather in (
        ("rows", table, [helper.make_node("Gather", ["T", "ids"], ["embedded"])]),
        (
            "columns",
            np.ascontiguousarray(table.T),
            [
                helper.make_node("Gather", ["T", "ids"], ["columns"], axis=1),
                helper.make_node("Transpose", ["columns"], ["embedded"], perm=[1, 2, 0]),
            ],
        ),
    ):
        graph_ = helper.make_graph(
            gather,
            name,
            [helper.make_tensor_value_info("ids", i64, [1, 1])],
            [helper.make_tensor_value_info("embedded", f32, [1, 1, width])],
            [numpy_helper.from_array(stored, "T")],
        )
        model = helper.make_model(graph_, opset_imports=[helper.make_opsetid("", 21)])
        model.ir_version = 10
        onnx.save_model(
            model, folder / f"{name}.onnx", save_as_external_data=True, location=f"{name}.data"
        )
    del table, stored, model
    sessions = {n: session(folder / f"{n}.onnx") for n in ("rows", "columns")}
    sessions["rows_again"] = session(folder / "rows.onnx")
    ids = np.random.default_rng(2).integers(0, vocabulary, (rounds + 5, 1, 1))
    times = {name: [] for name in sessions}
    rng = random.Random(0)
    for r in range(rounds + 5):
        for name in rng.sample(list(sessions), len(sessions)):
            start = time.perf_counter()
            sessions[name].run(None, {"ids": ids[r]})
            if r >= 5:
                times[name].append(time.perf_counter() - start)
    return {
        name: {
            "us": 1e6 * statistics.median(t),
            "ratio_to_rows": statistics.median(
                a / b for a, b in zip(t, times["rows"], strict=True)
            ),
        }
        for name, t in times.items()
    }


def main(argv: list[str] | None = None) -> dict:
    import onnx

    parser = argparse.ArgumentParser()
    parser.add_argument("--width", type=int, default=2048)
    parser.add_argument("--vocabulary", type=int, default=24000)
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--no-prepack", action="store_true", help="a control: no prepacking")
    parser.add_argument("--external", action="store_true", help="weights in a .data file")
    parser.add_argument("--embedding", action="store_true", help="the embedding's Gather alone")
    parser.add_argument("--memory-of", help=argparse.SUPPRESS)  # "folder:layout", internal
    args = parser.parse_args(argv)
    global PREPACK
    PREPACK = not args.no_prepack
    if args.memory_of:
        folder, layout = args.memory_of.rsplit(":", 1)
        print(json.dumps(memory(Path(folder) / f"{layout}.onnx", layout, args.width)))
        return {}
    with tempfile.TemporaryDirectory(prefix="tied_head.") as temporary:
        folder = Path(temporary)
        if args.embedding:
            before = _loadavg()
            results = embedding_timings(folder, args.width, args.vocabulary, args.rounds)
            results = {"arguments": vars(args), "loadavg": [before, _loadavg()], **results}
            print(json.dumps(results, indent=2))
            return results
        for layout in LAYOUTS:
            model, _ = graph(layout, args.width, args.vocabulary)
            onnx.save_model(
                model,
                folder / f"{layout}.onnx",
                save_as_external_data=args.external,
                location=f"{layout}.onnx.data",
            )
            del model
        table_bytes = args.width * args.vocabulary * 4
        results = {
            "arguments": vars(args),
            "table_bytes": table_bytes,
            "memory": {},
            "loadavg_before": _loadavg(),
        }
        for layout in LAYOUTS:
            command = [sys.executable, "-m", "benchmarks.tied_head", "--width", str(args.width)]
            command += ["--memory-of", f"{folder}:{layout}"]
            command += ["--no-prepack"] * args.no_prepack
            out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
            measured = json.loads(out.strip().splitlines()[-1])
            results["memory"][layout] = {k: v / table_bytes for k, v in measured.items()}
        results["timing"] = timings(folder, args.width, args.vocabulary, args.rounds)
        results["loadavg_after"] = _loadavg()
    print(json.dumps(results, indent=2))
    return results


def _loadavg() -> str:
    return Path("/proc/loadavg").read_text().strip()


if __name__ == "__main__":
    main()
