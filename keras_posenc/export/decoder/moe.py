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

Where the graph is quantized (`save_decoder(quantize=...)`) the experts are one
`com.microsoft.QMoE` instead (`_qmoe`, the same attributes, the router a float32 MatMul):
the genai builder's op for GPT-OSS at `-p int4` / `int8`, over `quantize.py`'s blocks.
"""

from __future__ import annotations

import numpy as np

from keras_posenc.export.decoder.description import Moe
from keras_posenc.export.decoder.graph_builder import MICROSOFT, GraphBuilder
from keras_posenc.export.decoder.quantize import Quantized, pack, quantize_as, zero_points
from keras_posenc.export.errors import ExportError

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


def _router_logits(g: GraphBuilder, hidden: str, moe: Moe, name: str) -> str:
    """`(tokens, experts)`: the router's float32 MatMul and bias (quantized files too)."""
    logits = g.node(
        "Add",
        [
            g.node("MatMul", [hidden, g.initializer(f"{name}.router", moe.router)]),
            g.initializer(f"{name}.router.bias", moe.router_bias),
        ],
    )
    return g.node("Reshape", [logits, g.constant([-1, moe.experts], np.int64)])


def _swiglu_attributes(moe: Moe) -> dict:
    """The attributes MoE and QMoE share: routing and keras_hub's clipped SwiGLU."""
    limit = {} if np.isinf(moe.limit) else {"swiglu_limit": moe.limit}
    return dict(
        k=moe.top_k,
        activation_type="swiglu",
        swiglu_fusion=1,
        activation_alpha=moe.alpha,
        activation_beta=1.0,
        normalize_routing_weights=1,
        **limit,
    )


def moe_contrib(g: GraphBuilder, i: int, hidden: str, moe: Moe) -> str:
    """The MoE's output `(batch, sequence, width)` of `hidden` as one `com.microsoft.MoE`,
    or where the graph is quantized (`g.quantization`) one `com.microsoft.QMoE`."""
    name = f"layers.{i}.moe"
    logits = _router_logits(g, hidden, moe, name)
    if getattr(g, "quantization", None) is not None:
        return _qmoe(g, i, hidden, logits, moe)
    # The kernels as (experts, out, in): the op multiplies by their transposes.
    fc1 = interleaved(moe.gate, moe.up).transpose(0, 2, 1)
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
        **_swiglu_attributes(moe),
    )


# --- quantized experts (QMoE) -------------------------------------------------------------
#
# QMoE stores each expert's `(K, N)` kernel as MatMulNBits does (`quantize.py`: blocks of
# `block_size` along K, the lower K index in the low nibble), by expert: weights uint8
# `(experts, N, K * bits / 8)`, scales `(experts, N, K / block_size)`, and for asymmetric
# blocks zero points `(experts, N, ceil(K / block_size * bits / 8))` (fc1_/fc2_zero_points:
# onnxruntime 1.32's CPU kernel reads them, tests/test_decoder_quantize_asymmetric.py). The experts'
# kernels are quantized as one `(experts * K, N)` matrix (`expert_kernels`): K a multiple of
# `block_size` (`refuse_unblockable_experts`), no block straddles two experts, so its blocks
# are each expert's own and `quantized_check` finds keras_hub's `(experts, K, N)` variables
# by the same matrix.


def expert_kernels(i: int, moe: Moe) -> list[tuple[str, np.ndarray]]:
    """`[(name, kernel (experts * K, N))]`: the fused gate/up (keras_hub's interleaved
    `gate_up_proj`, `(experts * width, 2 * intermediate)`) and the down projection
    (`(experts * intermediate, width)`), the two weights QMoE quantizes."""
    experts, width, _ = moe.gate.shape
    fc1 = interleaved(moe.gate, moe.up).reshape(experts * width, -1)
    return [(f"layers.{i}.moe.fc1", fc1), (f"layers.{i}.moe.fc2", moe.down.reshape(-1, width))]


def refuse_unblockable_experts(decoder, block_size: int) -> None:
    """Raises ExportError where an expert's K (the width for gate/up, the intermediate
    size for down) is not a whole number of blocks, which QMoE needs."""
    for i, block in enumerate(decoder.blocks):
        if block.mlp.kind != "moe":
            continue
        experts, width, intermediate = block.mlp.gate.shape
        for part, k in (("fc1 (gate/up)", width), ("fc2 (down)", intermediate)):
            if k % block_size:
                raise ExportError(
                    f"layers.{i}.moe {part}: an expert's input width K={k} is not a multiple "
                    f"of block_size={block_size}, which QMoE needs; pick a block_size (a "
                    "power of 2 >= 16) that divides it."
                )


def by_expert(stored: Quantized, experts: int) -> tuple[np.ndarray, ...]:
    """QMoE's `(weights (experts, N, K * bits / 8), scales (experts, N, K / block))` of
    `stored`, the `(experts * K, N)` matrix of `expert_kernels` quantized, and its zero
    points `(experts, N, ceil(K / block * bits / 8))` where it has them."""
    n, blocks, blob = stored.packed.shape
    packed = stored.packed.reshape(n, experts, blocks // experts, blob).transpose(1, 0, 2, 3)
    scales = stored.scales.reshape(n, experts, blocks // experts).transpose(1, 0, 2)
    arrays = (np.ascontiguousarray(packed.reshape(experts, n, -1)), np.ascontiguousarray(scales))
    if stored.zero_points is None:
        return arrays
    zeros = zero_points(stored).astype(np.uint8).reshape(n, experts, -1).transpose(1, 0, 2)
    return (*arrays, np.ascontiguousarray(pack(zeros, stored.bits, 1 << (stored.bits - 1))))


def _qmoe(g: GraphBuilder, i: int, hidden: str, logits: str, moe: Moe) -> str:
    """One `com.microsoft.QMoE` over `expert_kernels` quantized as `g.quantization` says.
    onnxruntime 1.32's CPU kernel computes 4-bit experts in float32 at accuracy_level 0/1
    and with int8 activations (per block of `block_size` along K) at 4; 8-bit experts with
    int8 activations at every level (docs/quantization.md)."""
    q = g.quantization
    biases = (interleaved(moe.gate_bias, moe.up_bias), moe.down_bias)
    inputs, zeros = [hidden, logits], []
    for (part, kernel), bias in zip(expert_kernels(i, moe), biases, strict=True):
        weights, scales, *zero = by_expert(quantize_as(kernel, q), moe.experts)
        inputs += [
            g.initializer(f"{part}.qweight", weights),
            g.initializer(f"{part}.scales", scales),
            g.initializer(f"{part}.bias", bias),
        ]
        zeros += [g.initializer(f"{part}.zero_points", z) for z in zero]
    if zeros:  # fc1_zero_points and fc2_zero_points follow the (absent) fc3 inputs
        inputs += ["", "", "", *zeros]
    return g.node(
        "QMoE",
        inputs,
        domain=MICROSOFT,
        expert_weight_bits=q.bits,
        block_size=q.block_size,
        accuracy_level=q.accuracy_level,
        **_swiglu_attributes(moe),
    )
