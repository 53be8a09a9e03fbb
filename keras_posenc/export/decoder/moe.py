"""A mixture-of-experts MLP (`description.Moe`, GPT-OSS's) in ONNX: dense, or one contrib op.

`moe_onnx` (the standard-op graph; LiteRT has its own dense form) uses ONNX's own
operators. Every expert runs on every token and the outputs are summed with the router's
weights, which are 0 outside each token's top k: the result is keras_hub's, which also runs
every expert densely (`GptOssExperts`) and weighs them by a dense `(tokens, experts)`
score, so nothing is skipped that keras_hub computes and the selection (`TopK`) is the
only discrete step. The experts' kernels are laid side by side, `(width, experts ·
intermediate)`, so the gate and up projections are one MatMul each; the down projection
weighs each expert's hidden units by its router weight first, so that one MatMul over
`experts · intermediate` is the weighted sum of the experts' outputs (the down biases
are weighed by a MatMul of the router weights). It computes all experts (GPT-OSS 20B's 32
instead of its 4).

`moe_contrib` (the GroupQueryAttention graph) is one `com.microsoft.MoE`, which runs
only each token's top k experts. Its CPU kernel (onnxruntime 1.32) matches keras_hub's
formula: it softmaxes all the router logits and renormalizes the top k
(`normalize_routing_weights=1`), which is the softmax of the top-k logits up to
rounding; `swiglu_fusion=1` reads keras_hub's interleaved gate/up columns; its SwiGLU
is `min(g, limit) · sigmoid(alpha · min(g, limit)) · (clip(u, -limit, limit) + beta)`
with `beta = 1`. keras_hub's gate also has a floor of -1e9, which the op lacks: below
it both give `g · sigmoid(alpha · g) = -0` in float32 (the sigmoid underflows), except
at `g = -inf` (keras_hub -0; the op, by its formula, NaN). Ties among router logits may
pick different experts (the op prefers the higher index, `TopK` the lower); random
weights have none.
"""

from __future__ import annotations

import numpy as np

from keras_posenc.export.decoder.description import Moe
from keras_posenc.export.decoder.graph_builder import MICROSOFT, GraphBuilder

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
    """The MoE's output `(batch, sequence, width)` of `hidden`, every expert computed."""
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


def interleaved(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    """`(experts, ..., intermediate)` gate and up as `(experts, ..., 2 · intermediate)`,
    gate and up alternating (keras_hub's `gate_up_proj` layout, `swiglu_fusion=1`)."""
    return np.stack([gate, up], axis=-1).reshape(*gate.shape[:-1], 2 * gate.shape[-1])


def moe_contrib(g: GraphBuilder, i: int, hidden: str, moe: Moe) -> str:
    """The MoE's output `(batch, sequence, width)` of `hidden` as one `com.microsoft.MoE`."""
    name = f"layers.{i}.moe"
    logits = g.node(
        "Add",
        [
            g.node("MatMul", [hidden, g.initializer(f"{name}.router", moe.router)]),
            g.initializer(f"{name}.router.bias", moe.router_bias),
        ],
    )
    logits = g.node("Reshape", [logits, g.constant([-1, moe.experts], np.int64)])
    # The kernels as (experts, out, in): the op multiplies by their transposes.
    fc1 = interleaved(moe.gate, moe.up).transpose(0, 2, 1)
    limit = {} if np.isinf(moe.limit) else {"swiglu_limit": moe.limit}
    return g.node(
        "MoE",
        [
            hidden,
            logits,
            g.initializer(f"{name}.fc1", np.ascontiguousarray(fc1)),
            g.initializer(f"{name}.fc1.bias", interleaved(moe.gate_bias, moe.up_bias)),
            g.initializer(f"{name}.fc2", np.ascontiguousarray(moe.down.transpose(0, 2, 1))),
            g.initializer(f"{name}.fc2.bias", moe.down_bias),
        ],
        domain=MICROSOFT,
        k=moe.top_k,
        activation_type="swiglu",
        swiglu_fusion=1,
        activation_alpha=moe.alpha,
        activation_beta=1.0,
        normalize_routing_weights=1,
        **limit,
    )
