"""The benchmark's reference: the graph onnxruntime-genai's model builder emits, built here by hand.

Written from a `Decoder` (`keras_posenc.export.decoder.description`: the arrays and
settings the export itself reads, from a step model by `describe_decoder` or from a
keras_hub CausalLM by `keras_posenc.keras_hub.describe_causal_lm`) with `onnx.helper`,
independently of the export's emitters (`onnx_decoder.py`, `gqa.py`, `projection.py`),
following the builder (`src/python/py/models/builders/base.py` and `gemma.py` of
onnxruntime-genai): the embedding `Gather` (times the embedding scale: Gemma's `Mul`),
per layer SimplifiedLayerNormalization (the first) or SkipSimplifiedLayerNormalization,
one packed q/k/v MatMul (three, with per-head q/k norms as `Reshape` ->
SimplifiedLayerNormalization -> `Reshape`, for Qwen3 and Gemma 3; the packed bias
`Add` for Qwen2), GroupQueryAttention with `do_rotary=1` and the description's cos/sin
caches (a layer's own where it has them), its query `scale`, `softcap` and
`local_window_size`, the output MatMul, the post-attention norm (Gemma 2/3), the MLP
(SwiGLU as `Sigmoid`/`Mul`, Gemma's GeGLU as `Gelu(approximate="tanh")` times up, GELU
as `Gelu`), the post-MLP norm, the head's MatMul, bias `Add` and final soft cap
(`Div` -> `Tanh` -> `Mul`); `seqlens_k = ReduceSum(attention_mask) - 1` and
`total_sequence_length = Shape(attention_mask)[1]`, both int32. No left-padding re-pack
(the builder has none): for a prompt padded on the left its logits differ, for a decode
step (what the benchmarks time) they are the export's.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

MS = "com.microsoft"


class _Graph:
    """Nodes and weights of the reference graph, named as the builder names its parts."""

    def __init__(self):
        self.nodes, self.weights, self._tables = [], [], {}

    def weight(self, name: str, array) -> str:
        array = np.asarray(array)
        if array.dtype.kind == "f":
            array = array.astype(np.float32)
        self.weights.append(numpy_helper.from_array(array, name))
        return name

    def node(self, op: str, inputs, outputs, domain: str = "", **attributes):
        self.nodes.append(helper.make_node(op, inputs, outputs, domain=domain, **attributes))
        return outputs[0] if len(outputs) == 1 else outputs

    def norm(self, x: str, norm, name: str) -> str:
        scale = self.weight(f"{name}.weight", norm.scale)
        return self.node(
            "SimplifiedLayerNormalization",
            [x, scale],
            [f"{name}.out"],
            axis=-1,
            epsilon=norm.epsilon,
            stash_type=1,
        )

    def skip_norm(self, x: str, residual: str, norm, name: str) -> tuple[str, str]:
        """`(norm(x + residual), x + residual)`."""
        outputs = [f"{name}.out", "", "", f"{name}.sum"]
        scale = self.weight(f"{name}.weight", norm.scale)
        self.node(
            "SkipSimplifiedLayerNormalization",
            [x, residual, scale],
            outputs,
            MS,
            epsilon=norm.epsilon,
        )
        return outputs[0], outputs[3]

    def cos_sin(self, rope) -> list[str]:
        if id(rope) not in self._tables:
            n = len(self._tables)
            self._tables[id(rope)] = [
                self.weight(f"cos_cache{n}", rope.cos),
                self.weight(f"sin_cache{n}", rope.sin),
            ]
        return self._tables[id(rope)]


def _head_norm(g: _Graph, x: str, norm, heads: int, head_dim: int, name: str) -> str:
    shape = g.weight(f"{name}.shape", np.array([0, 0, heads, head_dim], np.int64))
    flat = g.weight(f"{name}.flat", np.array([0, 0, heads * head_dim], np.int64))
    by_head = g.node("Reshape", [x, shape], [f"{name}.by_head"])
    return g.node("Reshape", [g.norm(by_head, norm, name), flat], [f"{name}.flat_out"])


def _qkv(g: _Graph, i: int, hidden: str, a) -> list[str]:
    """GroupQueryAttention's first three inputs, as the builder makes them."""
    prefix = f"layers.{i}.attn"
    biases = (a.query_bias, a.key_bias, a.value_bias)
    if a.query_norm is None and a.key_norm is None:
        packed = np.concatenate([a.query, a.key, a.value], axis=1)
        out = g.node("MatMul", [hidden, g.weight(f"{prefix}.qkv", packed)], [f"{prefix}.qkv_out"])
        if any(b is not None for b in biases):
            parts = zip(biases, (a.query, a.key, a.value), strict=True)
            bias = np.concatenate([np.zeros(k.shape[1]) if b is None else b for b, k in parts])
            out = g.node("Add", [out, g.weight(f"{prefix}.qkv_bias", bias)], [f"{prefix}.qkv_b"])
        return [out, "", ""]
    outputs = []
    for part, kernel, bias in zip("qkv", (a.query, a.key, a.value), biases, strict=True):
        out = g.node(
            "MatMul", [hidden, g.weight(f"{prefix}.{part}", kernel)], [f"{prefix}.{part}_out"]
        )
        if bias is not None:
            out = g.node(
                "Add", [out, g.weight(f"{prefix}.{part}_bias", bias)], [f"{prefix}.{part}_b"]
            )
        outputs.append(out)
    if a.query_norm is not None:
        outputs[0] = _head_norm(
            g, outputs[0], a.query_norm, a.num_heads, a.head_dim, f"{prefix}.q_norm"
        )
    if a.key_norm is not None:
        outputs[1] = _head_norm(
            g, outputs[1], a.key_norm, a.kv_num_heads, a.head_dim, f"{prefix}.k_norm"
        )
    return outputs


def _attention(g: _Graph, i: int, hidden: str, a, rope, interleaved: bool) -> str:
    attended = g.node(
        "GroupQueryAttention",
        [
            *_qkv(g, i, hidden, a),
            f"past_key_values.{i}.key",
            f"past_key_values.{i}.value",
            "seqlens_k",
            "total",
            *g.cos_sin(a.rope or rope),
        ],
        [f"attn{i}", f"present.{i}.key", f"present.{i}.value"],
        domain=MS,
        num_heads=a.num_heads,
        kv_num_heads=a.kv_num_heads,
        do_rotary=1,
        rotary_interleaved=int(interleaved),
        scale=float(a.scale),
        softcap=float(a.softcap),
        local_window_size=-1 if a.window is None else int(a.window),
    )[0]
    return g.node("MatMul", [attended, g.weight(f"o{i}", a.output)], [f"o_out{i}"])


def _mlp(g: _Graph, i: int, hidden: str, mlp) -> str:
    up = g.node("MatMul", [hidden, g.weight(f"up{i}", mlp.up)], [f"u{i}"])
    if mlp.kind == "gelu":
        inner = g.node("Gelu", [up], [f"act{i}"], approximate="none")
    else:
        gate = g.node("MatMul", [hidden, g.weight(f"gate{i}", mlp.gate)], [f"g{i}"])
        if mlp.kind == "swiglu":
            sigmoid = g.node("Sigmoid", [gate], [f"sg{i}"])
            act = g.node("Mul", [gate, sigmoid], [f"act{i}"])
        else:  # "geglu": the builder's FastGelu, ONNX's Gelu with the tanh approximation
            act = g.node("Gelu", [gate], [f"act{i}"], approximate="tanh")
        inner = g.node("Mul", [act, up], [f"gu{i}"])
    return g.node("MatMul", [inner, g.weight(f"down{i}", mlp.down)], [f"d{i}"])


def _mask_inputs(g: _Graph) -> None:
    """`seqlens_k` and `total` (int32) from `attention_mask`, as the builder derives them."""
    g.weight("one", np.array(1, np.int64))
    g.weight("axis1", np.array([1], np.int64))
    g.node("ReduceSum", ["attention_mask", "axis1"], ["mask_sum"], keepdims=0)
    g.node("Sub", ["mask_sum", "one"], ["seqlens64"])
    g.node("Cast", ["seqlens64"], ["seqlens_k"], to=TensorProto.INT32)
    g.node("Shape", ["attention_mask"], ["mask_shape"])
    g.node("Gather", ["mask_shape", "one"], ["total64"], axis=0)
    g.node("Cast", ["total64"], ["total"], to=TensorProto.INT32)


def _logits(g: _Graph, hidden: str, decoder) -> None:
    biased, capped = decoder.head_bias is not None, bool(decoder.final_softcap)
    name = "head_out" if biased or capped else "logits"
    logits = g.node("MatMul", [hidden, g.weight("head", decoder.head)], [name])
    if biased:
        bias = g.weight("head_bias", decoder.head_bias)
        logits = g.node("Add", [logits, bias], ["head_b" if capped else "logits"])
    if capped:
        cap = g.weight("final_softcap", np.array(decoder.final_softcap, np.float32))
        tanh = g.node("Tanh", [g.node("Div", [logits, cap], ["capped"])], ["capped_tanh"])
        g.node("Mul", [tanh, cap], ["logits"])


def _interface(decoder) -> tuple[list, list]:
    a = decoder.attention
    cache = ["batch", a.kv_num_heads, "past", a.head_dim]
    inputs = [
        helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "sequence"]),
        helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "total"]),
    ]
    outputs = [helper.make_tensor_value_info("logits", TensorProto.FLOAT, None)]
    for i in range(decoder.num_layers):
        for kind in ("key", "value"):
            name = f"past_key_values.{i}.{kind}"
            inputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, cache))
            outputs.append(
                helper.make_tensor_value_info(f"present.{i}.{kind}", TensorProto.FLOAT, None)
            )
    return inputs, outputs


def reference_graph(decoder) -> onnx.ModelProto:
    """The builder's graph of `decoder` (a `Decoder`; see the module docstring)."""
    g = _Graph()
    _mask_inputs(g)
    x = g.node("Gather", [g.weight("embed", decoder.embedding), "input_ids"], ["x0"])
    if decoder.embedding_scale != 1.0:
        scale = g.weight("embed_scale", np.array(decoder.embedding_scale, np.float32))
        x = g.node("Mul", [x, scale], ["x0_scaled"])
    hidden, residual = g.norm(x, decoder.blocks[0].attention_norm, "ln0"), x
    for i, block in enumerate(decoder.blocks):
        rope = decoder.rope
        attended = _attention(g, i, hidden, block.attention, rope, rope.interleaved)
        if block.post_attention_norm is not None:
            attended = g.norm(attended, block.post_attention_norm, f"post_attn{i}")
        hidden, residual = g.skip_norm(attended, residual, block.mlp_norm, f"pre_mlp{i}")
        out = _mlp(g, i, hidden, block.mlp)
        if block.post_mlp_norm is not None:
            out = g.norm(out, block.post_mlp_norm, f"post_mlp{i}")
        last = i + 1 == decoder.num_layers
        norm = decoder.final_norm if last else decoder.blocks[i + 1].attention_norm
        hidden, residual = g.skip_norm(out, residual, norm, f"ln{i + 1}")
    _logits(g, hidden, decoder)
    inputs, outputs = _interface(decoder)
    graph = helper.make_graph(g.nodes, "reference", inputs, outputs, g.weights)
    opsets = [helper.make_opsetid("", 21), helper.make_opsetid(MS, 1)]
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = 10
    return model
