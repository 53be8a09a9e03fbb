"""A mixture-of-experts MLP (`description.Moe`, GPT-OSS's) as ONNX's own operators.

Every expert runs on every token and the outputs are summed with the router's weights,
which are 0 outside each token's top k: the result is keras_hub's, which also runs
every expert densely (`GptOssExperts`) and weighs them by a dense `(tokens, experts)`
score, so nothing is skipped that keras_hub computes and the selection (`TopK`) is the
only discrete step. The experts' kernels are laid side by side, `(width, experts ·
intermediate)`, so the gate and up projections are one MatMul each; the down projection
weighs each expert's hidden units by its router weight first, so that one MatMul over
`experts · intermediate` is the weighted sum of the experts' outputs (the down biases
are weighed by a MatMul of the router weights). `com.microsoft.MoE` is not used: its
clamp and routing are not documented to the float as keras_hub's, and the dense form
writes the same graph for onnxruntime and for runtimes without contrib ops.

Only for tiny models is this cheap: the graph computes all experts (GPT-OSS 20B's 32
instead of its 4); `save_decoder` is meant here for verification-sized decoders.
"""

from __future__ import annotations

import numpy as np

from keras_posenc.export.decoder.description import Moe
from keras_posenc.export.decoder.graph import GraphBuilder

# keras_hub's lower clamp of the gate (`ops.clip(gate, -1e9, limit)`).
GATE_FLOOR = -1e9


def side_by_side(kernels: np.ndarray) -> np.ndarray:
    """`(experts, in, out)` kernels as one `(in, experts * out)` matrix, expert-major."""
    experts, width, out = kernels.shape
    return np.ascontiguousarray(kernels.transpose(1, 0, 2).reshape(width, experts * out))


def router_weights(g: GraphBuilder, hidden: str, moe: Moe, name: str) -> str:
    """`(batch, sequence, experts)`: softmax over each token's top-k router logits, 0
    for the other experts."""
    logits = g.node(
        "Add",
        [
            g.node("MatMul", [hidden, g.initializer(f"{name}.router", moe.router)]),
            g.initializer(f"{name}.router.bias", moe.router_bias),
        ],
    )
    values, indices = g.node("TopK", [logits, g.constant([moe.top_k], np.int64)], 2, axis=-1)
    probabilities = g.node("Softmax", [values], axis=-1)
    one_hot = g.node(
        "OneHot",
        [indices, g.constant(moe.experts, np.int64), g.constant([0.0, 1.0], np.float32)],
        axis=-1,
    )  # (batch, sequence, top_k, experts)
    weighted = g.node(
        "Mul", [one_hot, g.node("Unsqueeze", [probabilities, g.constant([-1], np.int64)])]
    )
    return g.node("ReduceSum", [weighted, g.constant([-2], np.int64)], keepdims=0)


def moe_onnx(g: GraphBuilder, i: int, hidden: str, moe: Moe) -> str:
    """The MoE's output `(batch, sequence, width)` of `hidden`."""
    name = f"layers.{i}.moe"
    weights = router_weights(g, hidden, moe, name)
    experts, intermediate = moe.gate_bias.shape
    by_expert = g.constant([0, 0, experts, intermediate], np.int64)

    def projection(kernel, bias, part: str) -> str:
        out = g.node("MatMul", [hidden, g.initializer(f"{name}.{part}", side_by_side(kernel))])
        out = g.node("Add", [out, g.initializer(f"{name}.{part}.bias", bias.reshape(-1))])
        return g.node("Reshape", [out, by_expert])  # (batch, sequence, experts, intermediate)

    f32 = np.float32
    gate = g.node(
        "Clip",
        [
            projection(moe.gate, moe.gate_bias, "gate"),
            g.constant(GATE_FLOOR, f32),
            g.constant(moe.limit, f32),
        ],
    )
    up = g.node(
        "Clip",
        [
            projection(moe.up, moe.up_bias, "up"),
            g.constant(-moe.limit, f32),
            g.constant(moe.limit, f32),
        ],
    )
    glu = g.node(
        "Mul", [gate, g.node("Sigmoid", [g.node("Mul", [gate, g.constant(moe.alpha, f32)])])]
    )
    units = g.node("Mul", [g.node("Add", [up, g.constant(1.0, f32)]), glu])
    units = g.node("Mul", [units, g.node("Unsqueeze", [weights, g.constant([-1], np.int64)])])
    units = g.node("Reshape", [units, g.constant([0, 0, experts * intermediate], np.int64)])
    down = moe.down.reshape(experts * intermediate, -1)
    out = g.node("MatMul", [units, g.initializer(f"{name}.down", down)])
    biases = g.node("MatMul", [weights, g.initializer(f"{name}.down.bias", moe.down_bias)])
    return g.node("Add", [out, biases])
