"""`python -m benchmarks.left_padding_nodes`: what the GQA graph's left-padding re-pack costs.

The nodes `GqaAttention.prepare` and `finish` add for left-padded prompts (docs/decoding.md)
are all that a decode step of our GroupQueryAttention file runs and the genai builder's
does not (docs/quantization.md, "Speed and size"). Timed alone, three one-purpose graphs
of `input_ids (B, S)`, `attention_mask (B, T)` and hidden states `(B, S, width)`: the
re-pack as `gqa.py` writes it, as it was written before (17 nodes: `back` through one more
`Add`, the hidden states through `Shape` + `Expand` + `GatherElements`), and none (Identity),
each after the six nodes of GroupQueryAttention's lengths that the builder's graph has
too. One intra-op thread, batch 1, one new token after 100, the three in a random order
per round; the CPU time of the calling thread (onnxruntime runs every node on it with one
thread); medians over rounds, and of each round's difference from the builder's.

    python -m benchmarks.left_padding_nodes
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import numpy as np
import onnx
from onnx import TensorProto, helper

from keras_posenc.export.decoder.gqa import GqaAttention
from keras_posenc.export.decoder.graph_builder import GraphBuilder

WIDTH, OPSET = 512, 21


def lengths(g: GraphBuilder) -> None:
    """GroupQueryAttention's `seqlens_k` and `total_sequence_length` from the mask: six
    nodes, in `prepare` and in the builder's graph alike."""
    i64 = np.int64
    total = g.node("ReduceSum", ["attention_mask", g.constant([1], i64)], keepdims=0)
    g.node("Cast", [g.node("Sub", [total, g.constant(1, i64)])], to=6)
    width = g.node("Shape", ["attention_mask"], start=1, end=2)
    g.node("Cast", [g.node("Squeeze", [width, g.constant([0], i64)])], to=6)


def before(g: GraphBuilder) -> tuple[str, str]:
    """The re-pack as gqa.py wrote it before 92a0066 (17 nodes, after `lengths`)."""
    i64 = np.int64
    lengths(g)
    length = g.node("Shape", ["input_ids"], start=1, end=2)
    maximum, one = g.constant([np.iinfo(i64).max], i64), g.constant([1], i64)
    new_mask = g.node("Slice", ["attention_mask", g.node("Neg", [length]), maximum, one])
    pad = g.node("ArgMax", [g.node("Cast", [new_mask], to=6)], axis=1, keepdims=1)
    end = g.node("Squeeze", [length, g.constant([0], i64)])
    columns = g.node("Range", [g.constant(0, i64), end, g.constant(1, i64)])
    packed = g.node("Mod", [g.node("Add", [columns, pad]), length])
    back = g.node("Mod", [g.node("Add", [g.node("Sub", [columns, pad]), length]), length])
    back = g.node("Unsqueeze", [back, g.constant([2], i64)])
    ids = g.node("GatherElements", ["input_ids", packed], axis=1)
    index = g.node("Expand", [back, g.node("Shape", ["hidden"])])
    return ids, g.node("GatherElements", ["hidden", index], axis=1)


def graph(kind: str) -> onnx.ModelProto:
    g = GraphBuilder()
    if kind == "builder":  # no re-pack
        lengths(g)
        ids, hidden = g.node("Identity", ["input_ids"]), g.node("Identity", ["hidden"])
    elif kind == "before":
        ids, hidden = before(g)
    else:  # prepare and finish read nothing of the decoder's description
        attend = GqaAttention.__new__(GqaAttention)
        ids = attend.prepare(g, "input_ids", "attention_mask")
        hidden = attend.finish(g, "hidden")
    # seqlens_k and total_sequence_length: outputs too, so that onnxruntime keeps them.
    extra = [n.output[0] for n in g.nodes if n.op_type == "Cast"][:2]
    inputs = [
        helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["B", "S"]),
        helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["B", "T"]),
        helper.make_tensor_value_info("hidden", TensorProto.FLOAT, ["B", "S", WIDTH]),
    ]
    outputs = [
        helper.make_tensor_value_info(ids, TensorProto.INT64, None),
        helper.make_tensor_value_info(hidden, TensorProto.FLOAT, None),
        *(helper.make_tensor_value_info(name, TensorProto.INT32, None) for name in extra),
    ]
    return g.model(inputs, outputs, OPSET, contrib=False)


def main(argv: list[str] | None = None) -> dict:
    import onnxruntime

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--runs", type=int, default=200, help="session runs per round")
    args = parser.parse_args(argv)
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    sessions, nodes = {}, {}
    for kind in ("ours", "before", "builder"):
        model = graph(kind)
        nodes[kind] = len(model.graph.node)
        sessions[kind] = onnxruntime.InferenceSession(
            model.SerializeToString(), options, providers=["CPUExecutionProvider"]
        )
    feeds = {
        "input_ids": np.ones((1, 1), np.int64),
        "attention_mask": np.ones((1, 101), np.int64),
        "hidden": np.random.default_rng(0).random((1, 1, WIDTH), np.float32),
    }

    def cpu_us(session) -> float:
        began = time.thread_time()
        for _ in range(args.runs):
            session.run(None, feeds)
        return (time.thread_time() - began) / args.runs * 1e6

    times = {kind: [] for kind in sessions}
    for _ in range(args.rounds):
        for kind in random.sample(list(sessions), len(sessions)):
            times[kind].append(cpu_us(sessions[kind]))
    result = {kind: statistics.median(t) for kind, t in times.items()}
    print(f"load average {open('/proc/loadavg').read().strip()}")
    for kind in ("ours", "before"):
        pairs = zip(times[kind], times["builder"], strict=True)
        extra = result[f"{kind} over builder"] = statistics.median(a - b for a, b in pairs)
        print(f"{kind:8s} {nodes[kind]:2d} nodes: {result[kind]:.1f} µs a run, {extra:.1f} µs more")
    print(f"builder  {nodes['builder']:2d} nodes: {result['builder']:.1f} µs a run (no re-pack)")
    return result


if __name__ == "__main__":
    main()
