"""`python -m benchmarks.moe_decode`: GPT-OSS's experts as one `com.microsoft.MoE` against dense.

A GPT-OSS-like keras_hub `GptOssCausalLM` (width 256, 4 layers, 8 query / 2 key-value
heads of 32, 8 experts of intermediate 256 of which 2 a token, a window of 128 on every
other layer, YaRN by 32, vocabulary 1024, cache 1024; keras_hub's initial weights) is
written as `save_decoder`'s GroupQueryAttention graph twice from the same description:
with each layer's experts as one `com.microsoft.MoE` (`moe`: what `save_decoder` writes,
only the top 2 experts of a token computed) and as the dense standard-op form of
`moe.py` (`dense`: all 8 computed, weighted 0 outside the top 2). One token per row,
batch 1 and 4, at positions 100 and 900; both sessions in one process, interleaved in a
random order per round, `intra_op_num_threads=1`, IOBinding with one buffer per layer
bound as past and present (`decode_floor.Bound`). Reported: medians of per-step times,
the median of the per-round ratios dense / moe, and the largest logit difference. Then
one layer's experts alone (the first layer's, as a one-node graph and as the dense
subgraph) on 1, 4 and 16 tokens of N(0, 1), timed the same way: where the op's work
grows with the distinct experts the tokens pick, the dense form's does not.

    python -m benchmarks.moe_decode              # about 30 s on 2 cores
    python -m benchmarks.moe_decode --rounds 10  # a quick look
"""

from __future__ import annotations

import os

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import argparse  # noqa: E402
import random  # noqa: E402
import statistics  # noqa: E402
from unittest import mock  # noqa: E402

import numpy as np  # noqa: E402

from benchmarks.decode_floor import VOCABULARY, Bound, _session  # noqa: E402

WIDTH, LAYERS, QUERY_HEADS, KV_HEADS, HEAD_DIM, INTERMEDIATE = 256, 4, 8, 2, 32, 256
EXPERTS, TOP_K, WINDOW, MAX_LENGTH = 8, 2, 128, 1024


def causal_lm():
    import keras
    import keras_hub

    keras.utils.set_random_seed(0)
    backbone = keras_hub.models.GptOssBackbone(
        vocabulary_size=VOCABULARY,
        num_layers=LAYERS,
        num_query_heads=QUERY_HEADS,
        hidden_dim=WIDTH,
        intermediate_dim=INTERMEDIATE,
        num_key_value_heads=KV_HEADS,
        num_experts=EXPERTS,
        top_k=TOP_K,
        sliding_window=WINDOW,
        rope_scaling_factor=32.0,
        head_dim=HEAD_DIM,
    )
    return keras_hub.models.GptOssCausalLM(backbone=backbone, preprocessor=None)


def graphs(decoder) -> dict:
    """`{"moe": the GQA graph as written, "dense": the same with the dense experts}`."""
    from keras_posenc.export.decoder import decoder_onnx, onnx_decoder
    from keras_posenc.export.decoder.moe import moe_onnx

    moe = decoder_onnx(decoder)
    with mock.patch.object(onnx_decoder, "moe_contrib", moe_onnx):
        dense = decoder_onnx(decoder)
    kinds = {
        name: [n.op_type for n in g.graph.node] for name, g in (("moe", moe), ("dense", dense))
    }
    assert kinds["moe"].count("MoE") == LAYERS and "TopK" not in kinds["moe"], "not the op"
    assert "MoE" not in kinds["dense"] and kinds["dense"].count("TopK") == LAYERS, "not dense"
    return {"moe": moe, "dense": dense}


def compare(sessions: dict, batch: int, position: int, rounds: int) -> dict:
    kv_shape = (KV_HEADS, MAX_LENGTH, HEAD_DIM)
    bound = {kind: Bound(session, batch, position, kv_shape) for kind, session in sessions.items()}
    for call in bound.values():
        call(), call()  # warm up
    times = {kind: [] for kind in bound}
    ratios = []
    rng = random.Random(position * 10 + batch)
    for _ in range(rounds):
        for kind in rng.sample(list(bound), len(bound)):
            times[kind].append(bound[kind]())
        ratios.append(times["dense"][-1] / times["moe"][-1])
    difference = np.abs(bound["moe"].logits.numpy() - bound["dense"].logits.numpy()).max()
    return {
        "batch": batch,
        "position": position,
        **{f"{kind}_ms": 1000 * statistics.median(t) for kind, t in times.items()},
        "dense_over_moe": statistics.median(ratios),
        "max_logit_diff": float(difference),
    }


def experts_alone(moe, rounds: int) -> list[dict]:
    """Microseconds per call of one layer's experts, the op against the dense subgraph."""
    import time

    from onnx import TensorProto, helper

    from keras_posenc.export.decoder.graph_builder import GraphBuilder
    from keras_posenc.export.decoder.moe import moe_contrib, moe_onnx

    def session(write):
        g = GraphBuilder()
        g.node("Identity", [write(g, 0, "x", moe)], ["y"])
        shape = ["tokens", 1, WIDTH]
        return _session(
            g.model(
                [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)],
                21,
            )
        )

    sessions = {"moe": session(moe_contrib), "dense": session(moe_onnx)}
    rows, rng = [], np.random.default_rng(0)
    for tokens in (1, 4, 16):
        feed = {"x": rng.standard_normal((tokens, 1, WIDTH)).astype(np.float32)}
        times = {kind: [] for kind in sessions}
        for session in sessions.values():
            session.run(None, feed)
        order = random.Random(tokens)
        for _ in range(5 * rounds):  # calls of tens of microseconds: more rounds
            for kind in order.sample(list(sessions), len(sessions)):
                start = time.perf_counter()
                sessions[kind].run(None, feed)
                times[kind].append(time.perf_counter() - start)
        medians = {kind: 1e6 * statistics.median(t) for kind, t in times.items()}
        rows.append({"tokens": tokens, **{f"{kind}_us": v for kind, v in medians.items()}})
        print(
            f"| {tokens} | {medians['moe']:.0f} | {medians['dense']:.0f} | "
            f"{medians['dense'] / medians['moe']:.2f} |",
            flush=True,
        )
    return rows


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=100, help="interleaved rounds (100)")
    args = parser.parse_args(argv)
    from keras_posenc.keras_hub import describe_causal_lm

    decoder = describe_causal_lm(causal_lm(), MAX_LENGTH)
    sessions = {kind: _session(graph) for kind, graph in graphs(decoder).items()}
    print("| batch | position | MoE op (ms) | dense (ms) | dense / MoE op | max logit diff |")
    print("| --- " * 6 + "|")
    rows = []
    for batch in (1, 4):
        for position in (100, 900):
            row = compare(sessions, batch, position, args.rounds)
            rows.append(row)
            print(
                f"| {batch} | {position} | {row['moe_ms']:.3f} | {row['dense_ms']:.3f} | "
                f"{row['dense_over_moe']:.2f} | {row['max_logit_diff']:.1e} |",
                flush=True,
            )
    print("\n| tokens | MoE op (us) | dense (us) | dense / MoE op |")
    print("| --- " * 4 + "|")
    experts_alone(decoder.blocks[0].mlp, args.rounds)
    return rows


if __name__ == "__main__":
    main()
