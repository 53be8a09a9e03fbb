"""The benchmark's reference: the graph onnxruntime-genai's model builder emits, built here by hand.

Written from a step model's Keras weights with `onnx.helper`, independently of
`keras_posenc.export.decoder`: per layer SimplifiedLayerNormalization (the first) or
SkipSimplifiedLayerNormalization, one packed q/k/v MatMul, GroupQueryAttention with
`do_rotary=1` and cos/sin caches computed here from the RoPE formula (plain RoPE), the
output MatMul, the SwiGLU MLP; `seqlens_k = ReduceSum(attention_mask) - 1` and
`total_sequence_length = Shape(attention_mask)[1]`, both int32. No left-padding re-pack
(the builder has none).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

MS = "com.microsoft"


def reference_graph(step_model, max_length: int) -> onnx.ModelProto:
    from keras_posenc import DecoderBlock

    layers = {type(layer).__name__: layer for layer in step_model.layers}
    blocks = [layer for layer in step_model.layers if isinstance(layer, DecoderBlock)]
    nodes, weights = [], []

    def weight(name, array):
        array = np.asarray(array)
        if array.dtype.kind == "f":
            array = array.astype(np.float32)
        weights.append(numpy_helper.from_array(array, name))
        return name

    def node(op, inputs, outputs, domain="", **attributes):
        nodes.append(helper.make_node(op, inputs, outputs, domain=domain, **attributes))
        return outputs[0]

    first = blocks[0]
    head_dim, heads, kv_heads = first.head_dim, first.num_query_heads, first.num_key_value_heads
    rope = first.attention.rotary_embedding
    inverse = rope.max_wavelength ** (-np.arange(0, head_dim, 2) / head_dim)
    angles = np.arange(max_length)[:, None] * inverse[None]
    weight("cos", np.cos(angles))
    weight("sin", np.sin(angles))
    weight("one", np.array(1, np.int64))
    weight("axis1", np.array([1], np.int64))
    node("ReduceSum", ["attention_mask", "axis1"], ["mask_sum"], keepdims=0)
    node("Sub", ["mask_sum", "one"], ["seqlens64"])
    node("Cast", ["seqlens64"], ["seqlens_k"], to=TensorProto.INT32)
    node("Shape", ["attention_mask"], ["mask_shape"])
    node("Gather", ["mask_shape", "one"], ["total64"], axis=0)
    node("Cast", ["total64"], ["total"], to=TensorProto.INT32)
    weight("embed", layers["Embedding"].embeddings.numpy())
    node("Gather", ["embed", "input_ids"], ["x0"])
    eps = first.layer_norm_epsilon
    weight("ln0", first.attention_norm.scale.numpy())
    node("SimplifiedLayerNormalization", ["x0", "ln0"], ["h0"], axis=-1, epsilon=eps, stash_type=1)
    hidden, residual = "h0", "x0"
    for i, block in enumerate(blocks):
        attention = block.attention
        width = attention._query_dense.kernel.shape[0]
        qkv = np.concatenate(
            [
                attention._query_dense.kernel.numpy().reshape(width, -1),
                attention._key_dense.kernel.numpy().reshape(width, -1),
                attention._value_dense.kernel.numpy().reshape(width, -1),
            ],
            axis=1,
        )
        node("MatMul", [hidden, weight(f"qkv{i}", qkv)], [f"qkv_out{i}"])
        past = [f"past_key_values.{i}.key", f"past_key_values.{i}.value"]
        node(
            "GroupQueryAttention",
            [f"qkv_out{i}", "", "", *past, "seqlens_k", "total", "cos", "sin"],
            [f"attn{i}", f"present.{i}.key", f"present.{i}.value"],
            domain=MS,
            num_heads=heads,
            kv_num_heads=kv_heads,
            do_rotary=1,
            rotary_interleaved=0,
            scale=float(1 / np.sqrt(head_dim)),
        )
        output = attention._output_dense.kernel.numpy().reshape(-1, width)
        node("MatMul", [f"attn{i}", weight(f"o{i}", output)], [f"o_out{i}"])
        weight(f"post{i}", block.mlp_norm.scale.numpy())
        node(
            "SkipSimplifiedLayerNormalization",
            [f"o_out{i}", residual, f"post{i}"],
            [f"m{i}", "", "", f"r{i}"],
            domain=MS,
            epsilon=eps,
        )
        node("MatMul", [f"m{i}", weight(f"gate{i}", block.gate.kernel.numpy())], [f"g{i}"])
        node("MatMul", [f"m{i}", weight(f"up{i}", block.up.kernel.numpy())], [f"u{i}"])
        node("Sigmoid", [f"g{i}"], [f"sg{i}"])
        node("Mul", [f"g{i}", f"sg{i}"], [f"silu{i}"])
        node("Mul", [f"silu{i}", f"u{i}"], [f"gu{i}"])
        node("MatMul", [f"gu{i}", weight(f"down{i}", block.down.kernel.numpy())], [f"d{i}"])
        last = i + 1 == len(blocks)
        scale = layers["RMSNormalization"].scale if last else blocks[i + 1].attention_norm.scale
        weight(f"next_ln{i}", scale.numpy())
        node(
            "SkipSimplifiedLayerNormalization",
            [f"d{i}", f"r{i}", f"next_ln{i}"],
            [f"h{i + 1}", "", "", f"x{i + 1}"],
            domain=MS,
            epsilon=eps,
        )
        hidden, residual = f"h{i + 1}", f"x{i + 1}"
    head = layers["Dense"]
    node("MatMul", [hidden, weight("head", head.kernel.numpy())], ["head_out"])
    node("Add", ["head_out", weight("head_bias", head.bias.numpy())], ["logits"])
    cache = ["batch", kv_heads, "past", head_dim]
    inputs = [
        helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "sequence"]),
        helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "total"]),
    ]
    outputs = [helper.make_tensor_value_info("logits", TensorProto.FLOAT, None)]
    for i in range(len(blocks)):
        for kind in ("key", "value"):
            inputs.append(
                helper.make_tensor_value_info(
                    f"past_key_values.{i}.{kind}", TensorProto.FLOAT, cache
                )
            )
            outputs.append(
                helper.make_tensor_value_info(f"present.{i}.{kind}", TensorProto.FLOAT, None)
            )
    graph = helper.make_graph(nodes, "reference", inputs, outputs, weights)
    opsets = [helper.make_opsetid("", 21), helper.make_opsetid(MS, 1)]
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = 10
    return model
