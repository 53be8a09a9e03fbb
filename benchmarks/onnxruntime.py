"""`python -m benchmarks.onnxruntime`: exported graphs in onnxruntime against their floors.

Cases (one process, every case's candidates interleaved in a random order per round;
medians of per-call times and the median of the per-round ratios):

- RoPE alone at (8, 512, 8, 64) and (1, 4096, 32, 128), start 0 and a runtime start:
  the export rewritten `"fused"` against a hand-built one-node `com.microsoft.RotaryEmbedding`
  graph (4096-row caches), `"standard"` (opset 23) beside it, `"decomposed"` against a
  hand-built least-work graph of standard ops (Split, Concat, two Mul and an Add on constant
  rows sliced by the length), the "halves" form of standard ops (four Mul on the halves)
  and the export as tf2onnx writes it;
- the additive layers (sinusoidal, learned; start 0 and a runtime start, which goes
  through an `If`) against `x + c` with a constant `c`, and against `x + c[start:start+n]`
  sliced from a constant table (the least a graph of dynamic length can do);
- a 2-block pre-norm encoder with `RotaryMultiHeadAttention` against the same encoder with
  `keras.layers.MultiHeadAttention`, in onnxruntime (both as `save_onnx` writes them: every
  pass of `onnx_passes.optimized`) and as a TensorFlow SavedModel.

Example:

    python -m benchmarks.onnxruntime            # about 5 minutes on 2 cores
    python -m benchmarks.onnxruntime --quick    # the small shapes only
    python -m benchmarks.onnxruntime --only additive,encoder
"""

from __future__ import annotations

import os

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import argparse  # noqa: E402
import copy  # noqa: E402
import gc  # noqa: E402
import json  # noqa: E402
import random  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from pathlib import Path  # noqa: E402

import keras  # noqa: E402
import numpy as np  # noqa: E402
import onnx  # noqa: E402
import onnxruntime as ort  # noqa: E402
import tensorflow as tf  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from keras_posenc import (  # noqa: E402
    LearnedPositionalEmbedding,
    RotaryEmbedding,
    RotaryMultiHeadAttention,
    SinusoidalPositionalEncoding,
    export,
)
from keras_posenc.export import onnx_passes  # noqa: E402
from keras_posenc.export.verify.runtimes import onnx_session  # noqa: E402
from keras_posenc.frequencies import CACHED_POSITIONS, inverse_frequencies  # noqa: E402

RUNTIME_START = 100  # a start fed at run time, rows still in the cache


def converted(model: keras.Model) -> onnx.ModelProto:
    """`export.onnx_model(model)`, with `Erfc` (from the exact gelu) rewritten first."""
    import tf2onnx

    proto, _ = tf2onnx.convert.from_function(
        export.serving_function(model), input_signature=export.input_signature(model), opset=17
    )
    onnx_passes.replace_erfc(proto)
    export.dedupe_constants(proto)
    onnx.checker.check_model(proto, full_check=True)
    return proto


THREADS = [1]  # onnxruntime's intra-op threads (--threads)


def session(proto: onnx.ModelProto) -> ort.InferenceSession:
    return onnx_session(proto, threads=THREADS[0])


def ort_call(proto: onnx.ModelProto, feeds: dict) -> Callable[[], object]:
    run = session(proto).run
    return lambda: run(None, feeds)


def _host_tables(dim: int) -> tuple[np.ndarray, np.ndarray]:
    angles = np.multiply.outer(
        np.arange(CACHED_POSITIONS, dtype=np.float64), inverse_frequencies(dim)
    )
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


def _model(nodes, inputs, initializers, opset=17, domains=()) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes,
        "floor",
        inputs,
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        initializer=initializers,
    )
    imports = [helper.make_opsetid("", opset), *(helper.make_opsetid(d, 1) for d in domains)]
    proto = helper.make_model(graph, opset_imports=imports)
    proto.ir_version = 9
    return proto


def kernel_graph(dim: int) -> onnx.ModelProto:
    """The one-node `com.microsoft.RotaryEmbedding` on (batch, sequence, heads·dim)."""
    cos, sin = _host_tables(dim)
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Reshape", ["x", "flat"], ["x3"]),
        helper.make_node(
            "RotaryEmbedding",
            ["x3", "start", "cos", "sin"],
            ["y3"],
            domain="com.microsoft",
            interleaved=0,
        ),
        helper.make_node("Reshape", ["y3", "shape"], ["y"]),
    ]
    initializers = [
        numpy_helper.from_array(cos, "cos"),
        numpy_helper.from_array(sin, "sin"),
        numpy_helper.from_array(np.array([0, 0, -1], np.int64), "flat"),
    ]
    inputs = [
        helper.make_tensor_value_info("x", TensorProto.FLOAT, None),
        helper.make_tensor_value_info("start", TensorProto.INT64, [1]),
    ]
    return _model(nodes, inputs, initializers, domains=("com.microsoft",))


def standard_floor_graph(dim: int, halves: bool = False) -> onnx.ModelProto:
    """Least-work standard ops: constant rows sliced by start and length, Split/Concat swap.

    `halves`: `y = concat(x1·c - x2·s, x2·c + x1·s)` on half tables instead.
    """
    cos, sin = _host_tables(dim)
    if halves:
        tables = {"C": cos, "S": sin}
    else:
        tables = {"C": np.concatenate([cos, cos], 1), "S": np.concatenate([-sin, sin], 1)}
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Slice", ["shape", "one", "two"], ["length"]),
        helper.make_node("Add", ["start", "length"], ["end"]),
    ]
    for name in tables:
        nodes += [
            helper.make_node("Slice", [name, "start", "end", "zero"], [name + "rows"]),
            helper.make_node("Unsqueeze", [name + "rows", "one"], [name + "b"]),
        ]
    nodes.append(helper.make_node("Split", ["x"], ["x1", "x2"], axis=-1))
    if halves:
        nodes += [
            helper.make_node("Mul", ["x1", "Cb"], ["a"]),
            helper.make_node("Mul", ["x2", "Sb"], ["b"]),
            helper.make_node("Mul", ["x2", "Cb"], ["c"]),
            helper.make_node("Mul", ["x1", "Sb"], ["d"]),
            helper.make_node("Sub", ["a", "b"], ["y1"]),
            helper.make_node("Add", ["c", "d"], ["y2"]),
            helper.make_node("Concat", ["y1", "y2"], ["y"], axis=-1),
        ]
    else:
        nodes += [
            helper.make_node("Concat", ["x2", "x1"], ["swapped"], axis=-1),
            helper.make_node("Mul", ["x", "Cb"], ["a"]),
            helper.make_node("Mul", ["swapped", "Sb"], ["b"]),
            helper.make_node("Add", ["a", "b"], ["y"]),
        ]
    return _x_and_start_model(nodes, tables)


def constant_add_graph(rows: np.ndarray) -> onnx.ModelProto:
    """`x + c` with the constant `c` of the input's exact shape minus the batch axis."""
    nodes = [helper.make_node("Add", ["x", "c"], ["y"])]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)]
    return _model(nodes, inputs, [numpy_helper.from_array(rows, "c")])


def sliced_add_graph(table: np.ndarray) -> onnx.ModelProto:
    """`x + table[start : start + length]`: the least a graph of dynamic length can do."""
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Slice", ["shape", "one", "two"], ["length"]),
        helper.make_node("Add", ["start", "length"], ["end"]),
        helper.make_node("Slice", ["table", "start", "end", "zero"], ["rows"]),
        helper.make_node("Add", ["x", "rows"], ["y"]),
    ]
    return _x_and_start_model(nodes, {"table": table})


def _x_and_start_model(nodes, tables: dict[str, np.ndarray]) -> onnx.ModelProto:
    """A graph of inputs `x` and `start` (int64 `[1]`), with `tables` and the int64
    constants `zero`, `one`, `two` the slices take."""
    initializers = [numpy_helper.from_array(v, k) for k, v in tables.items()] + [
        numpy_helper.from_array(np.array([v], np.int64), k)
        for k, v in (("zero", 0), ("one", 1), ("two", 2))
    ]
    inputs = [
        helper.make_tensor_value_info("x", TensorProto.FLOAT, None),
        helper.make_tensor_value_info("start", TensorProto.INT64, [1]),
    ]
    return _model(nodes, inputs, initializers)


def _layer_model(layer, shape, runtime_start: bool) -> keras.Model:
    x = keras.Input((None, *shape[2:]), name="x")
    inputs, call = [x], {}
    if runtime_start:
        start = keras.Input((), dtype="int32", name="start", batch_size=1)
        inputs.append(start)
        call["start_index"] = start[0]
    return keras.Model(inputs, layer(x, **call))


def rotary_cases(shape, small: bool) -> dict[str, dict[str, Callable]]:
    """`small`: also the forms only compared there (standard ops on halves, tf2onnx's own)."""
    dim = shape[-1]
    rng = np.random.default_rng(0)
    x = rng.standard_normal(shape).astype(np.float32)
    cases = {}
    for runtime_start in (False, True):
        # A runtime start that keeps the rows in the kernel graph's 4096-row cache.
        start = min(RUNTIME_START, CACHED_POSITIONS - shape[1]) if runtime_start else 0
        model = _layer_model(RotaryEmbedding(), shape, runtime_start)
        feeds = {"x": x, **({"start": np.array([start], np.int32)} if runtime_start else {})}
        base = export.onnx_model(model, rotary=None)
        candidates = {"tf2onnx": ort_call(base, feeds)} if small else {}
        for form in onnx_passes.FORMS:
            proto = copy.deepcopy(base)
            if form == "standard":
                proto = onnx_passes.to_opset(proto, onnx_passes.STANDARD_ROTARY_OPSET)
            onnx_passes.rewrite_rotations(proto, form)
            onnx_passes.streamline(proto)
            candidates[form] = ort_call(proto, feeds)
        floor_feeds = {"x": x, "start": np.array([start], np.int64)}
        candidates["kernel"] = ort_call(kernel_graph(dim), floor_feeds)
        candidates["least_work"] = ort_call(standard_floor_graph(dim), floor_feeds)
        if small:
            candidates["halves"] = ort_call(standard_floor_graph(dim, halves=True), floor_feeds)
        cases[f"rope {shape} {'runtime start' if runtime_start else 'start 0'}"] = candidates
    return cases


def additive_cases(shape) -> dict[str, dict[str, Callable]]:
    rng = np.random.default_rng(0)
    x = rng.standard_normal(shape).astype(np.float32)
    cases = {}
    layers = {
        "sinusoidal": lambda: SinusoidalPositionalEncoding(),
        "learned": lambda: LearnedPositionalEmbedding(1024),
    }
    for name, make in layers.items():
        for runtime_start in (False, True):
            layer = make()
            model = _layer_model(layer, shape, runtime_start)
            start = RUNTIME_START if runtime_start else 0
            feeds = {"x": x, **({"start": np.array([start], np.int32)} if runtime_start else {})}
            reference = np.asarray(model([x, feeds["start"]] if runtime_start else x))
            rows = (reference - x)[0]  # the rows the layer adds, as a constant
            table = np.zeros((CACHED_POSITIONS, shape[-1]), np.float32)
            table[start : start + shape[1]] = rows
            sliced_feeds = {"x": x, "start": np.array([start], np.int64)}
            cases[f"{name} {shape} {'runtime start' if runtime_start else 'start 0'}"] = {
                "export": ort_call(export.onnx_model(model), feeds),
                "x + c": ort_call(constant_add_graph(rows), {"x": x}),
                "x + sliced c": ort_call(sliced_add_graph(table), sliced_feeds),
            }
    return cases


def encoder(width: int, heads: int, rotary: bool) -> keras.Model:
    """2 pre-norm blocks: attention and a 4x gelu MLP, each with a residual."""
    x = keras.Input((None, width), name="x")
    h = x
    for _ in range(2):
        attention = (RotaryMultiHeadAttention if rotary else keras.layers.MultiHeadAttention)(
            num_heads=heads, key_dim=width // heads
        )
        normed = keras.layers.LayerNormalization()(h)
        h = h + attention(normed, normed)
        normed = keras.layers.LayerNormalization()(h)
        h = h + keras.layers.Dense(width)(keras.layers.Dense(4 * width, activation="gelu")(normed))
    return keras.Model(x, h)


def encoder_cases(width: int, shapes, folder: Path) -> dict[str, dict[str, Callable]]:
    heads = 8
    models = {name: encoder(width, heads, name == "rope") for name in ("rope", "plain")}
    protos, saved = {}, {}
    for name, model in models.items():
        protos[name] = converted(model)
        path = folder / f"{name}_{width}"
        export.save_saved_model(model, path)
        saved[name] = tf.saved_model.load(str(path)).signatures["serving_default"]
    # What save_onnx writes: every pass, the plain encoder's included.
    fused = onnx_passes.optimized(copy.deepcopy(protos["rope"]), rotary="fused")
    decomposed = onnx_passes.optimized(copy.deepcopy(protos["rope"]), rotary="decomposed")
    plain = onnx_passes.optimized(protos["plain"])
    cases = {}
    rng = np.random.default_rng(0)
    for batch, length in shapes:
        x = rng.standard_normal((batch, length, width)).astype(np.float32)
        feeds = {"x": x}
        tensor = tf.constant(x)
        cases[f"encoder w{width} {batch}x{length}"] = {
            "ort rope fused": ort_call(fused, feeds),
            "ort rope decomposed": ort_call(decomposed, feeds),
            "ort plain": ort_call(plain, feeds),
            "tf rope": lambda f=saved["rope"], t=tensor: f(x=t),
            "tf plain": lambda f=saved["plain"], t=tensor: f(x=t),
        }
    return cases


def run_rounds(cases: dict, budget: float, max_rounds: int, seed: int = 0) -> dict:
    """Per-call seconds of every sample, per case and candidate, in interleaved rounds.

    A sample repeats a call for about `MIN_SAMPLE` seconds. Each case gets as many rounds
    (5 to `max_rounds`) as fit in its share of `budget` seconds.
    """
    repeats, samples, rounds = {}, {}, {}
    share = budget / len(cases)
    for case, candidates in cases.items():
        round_seconds = 0.0
        for name, call in candidates.items():
            for _ in range(2):
                call()
            start = time.perf_counter()
            call()
            once = time.perf_counter() - start
            repeats[case, name] = max(1, min(100, round(MIN_SAMPLE / max(once, 1e-6))))
            round_seconds += once * repeats[case, name]
            samples[case, name] = []
        rounds[case] = max(5, min(max_rounds, int(share / round_seconds)))
    order = random.Random(seed)
    gc.disable()
    try:
        for index in range(max(rounds.values())):
            for case, candidates in cases.items():
                if index >= rounds[case]:
                    continue
                names = list(candidates)
                order.shuffle(names)
                for name in names:
                    call, count = candidates[name], repeats[case, name]
                    start = CLOCK()
                    for _ in range(count):
                        call()
                    samples[case, name].append((CLOCK() - start) / count)
    finally:
        gc.enable()
    return {
        case: {name: samples[case, name] for name in candidates}
        for case, candidates in cases.items()
    }


MIN_SAMPLE = 0.01
# CPU seconds of the whole process (every thread: TensorFlow's pools, onnxruntime's): on a
# machine shared with other jobs, wall time counts the time they hold the cores.
CLOCK = time.process_time
RATIOS = {
    "rope": [
        ("fused", "kernel"),
        ("standard", "kernel"),
        ("decomposed", "least_work"),
        ("halves", "least_work"),
        ("tf2onnx", "least_work"),
        ("least_work", "kernel"),
    ],
    "sinusoidal": [("export", "x + c"), ("export", "x + sliced c"), ("x + sliced c", "x + c")],
    "learned": [("export", "x + c"), ("export", "x + sliced c"), ("x + sliced c", "x + c")],
    "encoder": [
        ("ort rope fused", "ort plain"),
        ("ort rope decomposed", "ort plain"),
        ("tf rope", "tf plain"),
        ("ort rope fused", "tf rope"),
        ("ort plain", "tf plain"),
    ],
}
TARGETS = {
    ("fused", "kernel"): 1.2,
    ("decomposed", "least_work"): 1.2,
    ("export", "x + c"): 1.2,
    ("ort rope fused", "ort plain"): 1.05,
}


def summary(samples: dict) -> list[dict]:
    """Per ratio: medians of each side, and the median of the ratios within each round.

    Within a round the two samples lie close in time, so their ratio is less exposed to a
    shared machine's slow spells than the ratio of the two medians.
    """
    table = []
    for case, times in samples.items():
        for numerator, denominator in RATIOS[case.split()[0]]:
            if numerator not in times or denominator not in times:
                continue
            paired = [a / b for a, b in zip(times[numerator], times[denominator], strict=True)]
            table.append(
                {
                    "case": case,
                    "candidate": numerator,
                    "ms": 1e3 * statistics.median(times[numerator]),
                    "versus": denominator,
                    "versus_ms": 1e3 * statistics.median(times[denominator]),
                    "ratio": statistics.median(paired),
                    "slower_rounds": sum(r > 1 for r in paired),
                    "rounds": len(paired),
                    "target": TARGETS.get((numerator, denominator)),
                }
            )
    return table


def markdown(table: list[dict]) -> str:
    lines = [
        "| case | candidate | ms | vs | ms | ratio | slower in | target |",
        "|---|---|---:|---|---:|---:|---:|---|",
    ]
    for row in table:
        target = row["target"]
        verdict = (
            ""
            if target is None
            else f"<= {target}: {'met' if row['ratio'] <= target else 'MISSED'}"
        )
        lines.append(
            f"| {row['case']} | {row['candidate']} | {row['ms']:.3f} | {row['versus']} | "
            f"{row['versus_ms']:.3f} | {row['ratio']:.2f} | {row['slower_rounds']}/{row['rounds']} "
            f"| {verdict} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the small shapes only")
    parser.add_argument("--seconds", type=float, default=120.0, help="time for the timed rounds")
    parser.add_argument("--max-rounds", type=int, default=41)
    parser.add_argument("--json", type=Path, default=None, help="also write the table here")
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="onnxruntime intra-op threads (1: a shared machine's other jobs do not stall a "
        "spinning thread pool; 0: onnxruntime's default, one per core)",
    )
    parser.add_argument(
        "--wall", action="store_true", help="time by the wall clock, not the process's CPU time"
    )
    parser.add_argument(
        "--only",
        default="rope,additive,encoder",
        help="the kinds of case to run, comma-separated: rope, additive, encoder",
    )
    args = parser.parse_args(argv)
    THREADS[0] = args.threads
    global CLOCK
    CLOCK = time.perf_counter if args.wall else time.process_time
    kinds = set(args.only.split(","))
    if kinds - {"rope", "additive", "encoder"}:
        parser.error(f"--only: unknown kinds {sorted(kinds - {'rope', 'additive', 'encoder'})}")
    cases = {}
    if "rope" in kinds:
        cases.update(rotary_cases((8, 512, 8, 64), small=True))
        if not args.quick:
            cases.update(rotary_cases((1, 4096, 32, 128), small=False))
    if "additive" in kinds:
        cases.update(additive_cases((8, 512, 256)))
    with tempfile.TemporaryDirectory() as folder:
        if "encoder" in kinds:
            shapes = [(1, 128)] if args.quick else [(1, 128), (8, 512)]
            cases.update(encoder_cases(256, shapes, Path(folder)))
            if not args.quick:
                cases.update(encoder_cases(512, [(1, 128), (8, 512)], Path(folder)))
        samples = run_rounds(cases, args.seconds, args.max_rounds)
    load = ", ".join(f"{v:.1f}" for v in os.getloadavg())
    print(
        f"onnxruntime {ort.__version__}, tensorflow {tf.__version__}, {os.cpu_count()} cores "
        f"(load {load}), onnxruntime threads {args.threads or 'default'}, "
        f"{'wall' if args.wall else 'process CPU'} time"
    )
    table = summary(samples)
    print(markdown(table))
    if args.json:
        args.json.write_text(json.dumps(table, indent=1))
    return table


if __name__ == "__main__":
    main()
