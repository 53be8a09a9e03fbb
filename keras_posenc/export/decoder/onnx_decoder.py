"""A `Decoder` as an ONNX graph in onnxruntime-genai's decoder interface, made with `onnx.helper`.

Inputs `input_ids` int64 `(batch, sequence)`, `attention_mask` int64 `(batch,
total_sequence_length)`, `past_key_values.{i}.key|value` float32 `(batch,
num_key_value_heads, max_length, head_dim)`; outputs `logits` `(batch, sequence,
vocabulary)` and `present.{i}.key|value` of the past's shape, so that one buffer per layer
can be bound as both (genai's past_present_share_buffer). No converter in between: the
graph is what the genai model builder writes for a Llama-style model, node for node
(`SimplifiedLayerNormalization` / `SkipSimplifiedLayerNormalization` for the norms and
the residual adds, MatMuls, the attention of `attention=`, a mixture of experts as one
`com.microsoft.MoE`). With `attention="standard"` every node is ONNX's own (opset 24):
`RMSNormalization` and `Add` for the norms and residuals, `Gelu`, the attention of
`standard.py` and the dense mixture of experts of `moe.py`.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper

from keras_posenc.export.decoder.description import Decoder, Mlp, Moe
from keras_posenc.export.decoder.gqa import GqaAttention
from keras_posenc.export.decoder.graph import MICROSOFT, GraphBuilder
from keras_posenc.export.decoder.moe import moe_contrib, moe_onnx
from keras_posenc.export.decoder.runtime_version import refuse_older_onnxruntime

GQA_OPSET = 21


def _norm(g: GraphBuilder, x: str, scale: np.ndarray, epsilon: float, name: str) -> str:
    op = "RMSNormalization" if g.standard else "SimplifiedLayerNormalization"
    return g.node(op, [x, g.initializer(name, scale)], axis=-1, epsilon=epsilon, stash_type=1)


def _skip_norm(g, x: str, residual: str, scale, epsilon: float, name: str) -> tuple[str, str]:
    """`(norm(x + residual), x + residual)`, in one node where contrib ops are allowed."""
    if g.standard:
        total = g.node("Add", [x, residual])
        return _norm(g, total, scale, epsilon, name), total
    normed, total = g.node(
        "SkipSimplifiedLayerNormalization",
        [x, residual, g.initializer(name, scale)],
        [g.name(f"{name}.out"), "", "", g.name(f"{name}.sum")],
        domain=MICROSOFT,
        epsilon=epsilon,
    )[::3]
    return normed, total


def _mlp(g: GraphBuilder, i: int, hidden: str, mlp: Mlp | Moe) -> str:
    if isinstance(mlp, Moe):  # one contrib MoE where contrib ops are allowed (`moe.py`)
        return moe_onnx(g, i, hidden, mlp) if g.standard else moe_contrib(g, i, hidden, mlp)
    up = g.node("MatMul", [hidden, g.initializer(f"layers.{i}.mlp.up_proj", mlp.up)])
    if mlp.kind == "swiglu":
        gate = g.node("MatMul", [hidden, g.initializer(f"layers.{i}.mlp.gate_proj", mlp.gate)])
        silu = g.node("Mul", [gate, g.node("Sigmoid", [gate])])
        hidden = g.node("Mul", [silu, up])
    elif mlp.kind == "geglu":  # Gemma: tanh-approximated GELU of the gate, times up
        gate = g.node("MatMul", [hidden, g.initializer(f"layers.{i}.mlp.gate_proj", mlp.gate)])
        hidden = g.node("Mul", [g.node("Gelu", [gate], approximate="tanh"), up])
    else:
        hidden = g.node("Gelu", [up], domain="" if g.standard else MICROSOFT)
    return g.node("MatMul", [hidden, g.initializer(f"layers.{i}.mlp.down_proj", mlp.down)])


def interface(decoder: Decoder) -> tuple[list, list]:
    """The graph's `(inputs, outputs)` value infos."""
    attention = decoder.attention
    cache = ["batch_size", attention.kv_num_heads, "past_sequence_length", attention.head_dim]
    present = ["batch_size", attention.kv_num_heads, "total_sequence_length", attention.head_dim]
    inputs = [
        helper.make_tensor_value_info(
            "input_ids", TensorProto.INT64, ["batch_size", "sequence_length"]
        ),
        helper.make_tensor_value_info(
            "attention_mask", TensorProto.INT64, ["batch_size", "total_sequence_length"]
        ),
    ]
    outputs = [
        helper.make_tensor_value_info(
            "logits", TensorProto.FLOAT, ["batch_size", "sequence_length", decoder.vocabulary]
        )
    ]
    for i in range(decoder.num_layers):
        for kind in ("key", "value"):
            inputs.append(
                helper.make_tensor_value_info(
                    f"past_key_values.{i}.{kind}", TensorProto.FLOAT, cache
                )
            )
            outputs.append(
                helper.make_tensor_value_info(f"present.{i}.{kind}", TensorProto.FLOAT, present)
            )
    return inputs, outputs


def decoder_onnx(decoder: Decoder, attention: str = "gqa") -> onnx.ModelProto:
    """The ONNX model of `decoder` (see the module docstring).

    Args:
        decoder: from `describe_decoder`.
        attention: `"gqa"` (`com.microsoft.GroupQueryAttention`) or `"standard"` (ONNX's
            own operators only for the attention; see `standard.py`).
    """
    if attention in ("gqa", "standard"):
        refuse_older_onnxruntime(decoder, attention)
    g = GraphBuilder()
    g.standard = attention == "standard"
    if attention == "gqa":
        attend, opset = GqaAttention(decoder), GQA_OPSET
    elif attention == "standard":
        from keras_posenc.export.decoder.standard import STANDARD_OPSET, StandardAttention

        attend, opset = StandardAttention(decoder), STANDARD_OPSET
    else:
        raise ValueError(f"attention must be 'gqa' or 'standard', got {attention!r}.")
    ids = attend.prepare(g, "input_ids", "attention_mask")
    x = g.node("Gather", [g.initializer("embed_tokens", decoder.embedding), ids])
    if decoder.embedding_scale != 1.0:
        x = g.node("Mul", [x, g.constant(decoder.embedding_scale, np.float32)])
    first = decoder.blocks[0].attention_norm
    hidden = _norm(g, x, first.scale, first.epsilon, "layers.0.input_layernorm")
    residual = x
    for i, block in enumerate(decoder.blocks):
        attended = attend.layer(g, i, hidden, block.attention)
        if block.post_attention_norm is not None:
            post = block.post_attention_norm
            attended = _norm(g, attended, post.scale, post.epsilon, f"layers.{i}.post_attn_norm")
        norm = block.mlp_norm
        hidden, residual = _skip_norm(
            g, attended, residual, norm.scale, norm.epsilon, f"layers.{i}.post_attention_layernorm"
        )
        mlp_out = _mlp(g, i, hidden, block.mlp)
        if block.post_mlp_norm is not None:
            post = block.post_mlp_norm
            mlp_out = _norm(g, mlp_out, post.scale, post.epsilon, f"layers.{i}.post_mlp_norm")
        if i + 1 < decoder.num_layers:
            norm, name = decoder.blocks[i + 1].attention_norm, f"layers.{i + 1}.input_layernorm"
        else:
            norm, name = decoder.final_norm, "norm"
        if block.output_scale == 1.0:
            hidden, residual = _skip_norm(g, mlp_out, residual, norm.scale, norm.epsilon, name)
        else:  # Gemma 4's layer_scalar: the sum scaled before the next norm reads it
            total = g.node("Add", [mlp_out, residual])
            residual = g.node("Mul", [total, g.constant(block.output_scale, np.float32)])
            hidden = _norm(g, residual, norm.scale, norm.epsilon, name)
    hidden = attend.finish(g, hidden)
    head = g.initializer("lm_head", decoder.head)
    capped, biased = decoder.final_softcap > 0, decoder.head_bias is not None
    logits = g.node("MatMul", [hidden, head], 1 if biased or capped else ["logits"])
    if biased:
        bias = g.initializer("lm_head.bias", decoder.head_bias)
        logits = g.node("Add", [logits, bias], 1 if capped else ["logits"])
    if capped:
        cap = g.constant(decoder.final_softcap, np.float32)
        g.node("Mul", [g.node("Tanh", [g.node("Div", [logits, cap])]), cap], ["logits"])
    inputs, outputs = interface(decoder)
    model = g.model(inputs, outputs, opset, contrib=not g.standard)
    check(model)
    return model


def check(model: onnx.ModelProto) -> None:
    """`onnx.checker.check_model(full_check=True)`, but for `SimplifiedLayerNormalization`:
    onnxruntime's own operator in ONNX's domain (as the genai builder writes it), which
    ONNX has no schema for; the check runs on a copy that puts it in a domain of its own."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    for node in copy.graph.node:
        if node.op_type == "SimplifiedLayerNormalization" and node.domain == "":
            node.domain = "onnxruntime.onnx_domain_op"
    copy.opset_import.append(helper.make_opsetid("onnxruntime.onnx_domain_op", 1))
    onnx.checker.check_model(copy, full_check=True)
