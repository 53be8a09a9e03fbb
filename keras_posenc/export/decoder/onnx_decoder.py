"""A `Decoder` as an ONNX graph in onnxruntime-genai's decoder interface, made with `onnx.helper`.

The interface (inputs `input_ids`, `attention_mask` and each layer's past cache; outputs
`logits` and the present caches, one buffer per layer bound as both) is
`genai_interface.py`'s. Each layer's cache has its own head count and size (Gemma 4's
global layers), and a KV-sharing layer has none (genai finds the cached layers by their
input names). Gemma 4's per-layer embeddings are computed from
`input_ids` inside the graph. No converter in between: the
graph is what the genai model builder writes for a Llama-style model, node for node
(`SimplifiedLayerNormalization` / `SkipSimplifiedLayerNormalization` for the norms and
the residual adds, MatMuls, the attention of `attention=`, a mixture of experts as one
`com.microsoft.MoE`). With `attention="standard"` every node is ONNX's own (opset 23):
`RMSNormalization` and `Add` for the norms and residuals, `Gelu`, the attention of
`standard.py` and the dense mixture of experts of `moe.py`.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper

from keras_posenc.export.decoder import progress
from keras_posenc.export.decoder.description import Decoder, Mlp, Moe, PerLayerInputs
from keras_posenc.export.decoder.genai_interface import (
    ATTENTION_MASK,
    INPUT_IDS,
    LOGITS,
    value_infos,
)
from keras_posenc.export.decoder.gqa import GqaAttention
from keras_posenc.export.decoder.graph_builder import MICROSOFT, GraphBuilder
from keras_posenc.export.decoder.moe import moe_contrib, moe_onnx
from keras_posenc.export.decoder.quantization_arguments import refuse_keras_quantized
from keras_posenc.export.decoder.quantized_graph import (
    embedding_lookup,
    head_matmul,
    refuse_unquantizable,
    weight_matmul,
)
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
    up = weight_matmul(g, hidden, mlp.up, f"layers.{i}.mlp.up_proj")
    if mlp.kind == "swiglu":
        gate = weight_matmul(g, hidden, mlp.gate, f"layers.{i}.mlp.gate_proj")
        silu = g.node("Mul", [gate, g.node("Sigmoid", [gate])])
        hidden = g.node("Mul", [silu, up])
    elif mlp.kind == "geglu":  # Gemma: tanh-approximated GELU of the gate, times up
        gate = weight_matmul(g, hidden, mlp.gate, f"layers.{i}.mlp.gate_proj")
        hidden = g.node("Mul", [g.node("Gelu", [gate], approximate="tanh"), up])
    else:
        hidden = g.node("Gelu", [up], domain="" if g.standard else MICROSOFT)
    return weight_matmul(g, hidden, mlp.down, f"layers.{i}.mlp.down_proj")


def _per_layer_inputs(g: GraphBuilder, ids: str, x: str, ple: PerLayerInputs, layers: int):
    """Gemma 4's per-layer inputs `(batch, sequence, num_layers, per_layer_width)`: one
    norm over every layer's slice at once (see `PerLayerInputs`)."""
    shape = g.constant([0, 0, layers, ple.width], np.int64)
    embedded = g.node("Gather", [g.initializer("embed_tokens_per_layer", ple.embedding), ids])
    embedded = g.node("Mul", [embedded, g.constant(ple.embedding_scale, np.float32)])
    projected = g.node("MatMul", [x, g.initializer("per_layer_model_projection", ple.projection)])
    projected = g.node("Mul", [projected, g.constant(ple.projection_scale, np.float32)])
    projected = g.node("Reshape", [projected, shape])
    normed = _norm(g, projected, ple.norm.scale, ple.norm.epsilon, "per_layer_projection_norm")
    total = g.node("Add", [normed, g.node("Reshape", [embedded, shape])])
    return g.node("Mul", [total, g.constant(ple.combine_scale, np.float32)])


def _block_end(g, i: int, block, total: str, per_layer: str | None) -> str:
    """The block's output from `total` (its MLP's residual sum): Gemma 4's per-layer
    gate, then its `output_scale`."""
    gate = block.per_layer_gate
    if gate is not None:
        # A one-element index (an initializer has at least one dimension), then squeezed.
        layer_input = g.node("Gather", [per_layer, g.constant([i], np.int64)], axis=2)
        layer_input = g.node("Squeeze", [layer_input, g.constant([2], np.int64)])
        gated = g.node("MatMul", [total, g.initializer(f"layers.{i}.per_layer_gate", gate.gate)])
        gated = g.node("Mul", [g.node("Gelu", [gated], approximate="tanh"), layer_input])
        gated = g.node("MatMul", [gated, g.initializer(f"layers.{i}.per_layer_up", gate.up)])
        gated = _norm(g, gated, gate.norm.scale, gate.norm.epsilon, f"layers.{i}.per_layer_norm")
        total = g.node("Add", [total, gated])
    if block.output_scale != 1.0:
        total = g.node("Mul", [total, g.constant(block.output_scale, np.float32)])
    return total


def decoder_onnx(decoder: Decoder, attention: str = "gqa", quantization=None) -> onnx.ModelProto:
    """The ONNX model of `decoder` (see the module docstring).

    Args:
        decoder: from `describe_decoder`.
        attention: `"gqa"` (`com.microsoft.GroupQueryAttention`) or `"standard"` (ONNX's
            own operators only for the attention; see `standard.py`).
        quantization: None (float32 weights) or a `quantized_graph.Quantization`: the
            projections and head as MatMulNBits, or with `"standard"` DequantizeLinear +
            MatMul (`quantized_graph.py`).
    """
    if attention in ("gqa", "standard"):
        refuse_older_onnxruntime(decoder, attention)
    if quantization is not None:
        if decoder.stored is None:
            refuse_unquantizable(decoder, quantization, attention)
        else:
            refuse_keras_quantized(decoder, attention)
    elif decoder.stored is not None:
        raise ValueError("a model Keras quantized is written with its Quantization.")
    g = GraphBuilder()
    g.standard = attention == "standard"
    g.quantization = quantization
    g.stored = decoder.stored
    if attention == "gqa":
        attend, opset = GqaAttention(decoder), GQA_OPSET
    elif attention == "standard":
        from keras_posenc.export.decoder.standard import STANDARD_OPSET, StandardAttention

        attend, opset = StandardAttention(decoder), STANDARD_OPSET
    else:
        raise ValueError(f"attention must be 'gqa' or 'standard', got {attention!r}.")
    ids = attend.prepare(g, INPUT_IDS, ATTENTION_MASK)
    x = embedding_lookup(g, decoder, ids)
    if decoder.embedding_scale != 1.0:
        x = g.node("Mul", [x, g.constant(decoder.embedding_scale, np.float32)])
    per_layer = None
    if decoder.per_layer_inputs is not None:
        per_layer = _per_layer_inputs(g, ids, x, decoder.per_layer_inputs, decoder.num_layers)
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
        if block.output_scale == 1.0 and block.per_layer_gate is None:
            hidden, residual = _skip_norm(g, mlp_out, residual, norm.scale, norm.epsilon, name)
        else:  # Gemma 4's per-layer gate and layer_scalar, before the next norm reads it
            total = g.node("Add", [mlp_out, residual])
            residual = _block_end(g, i, block, total, per_layer)
            hidden = _norm(g, residual, norm.scale, norm.epsilon, name)
        progress.layer(i, decoder.num_layers)
    hidden = attend.finish(g, hidden)
    capped, biased = decoder.final_softcap > 0, decoder.head_bias is not None
    logits = head_matmul(g, hidden, decoder.head, 1 if biased or capped else [LOGITS])
    if biased:
        bias = g.initializer("lm_head.bias", decoder.head_bias)
        logits = g.node("Add", [logits, bias], 1 if capped else [LOGITS])
    if capped:
        cap = g.constant(decoder.final_softcap, np.float32)
        g.node("Mul", [g.node("Tanh", [g.node("Div", [logits, cap])]), cap], [LOGITS])
    inputs, outputs = value_infos(decoder)
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
    # Weights in model.onnx.data (not readable from a ModelProto without its folder): checked
    # as graph inputs of their type and shape, which is all the check reads of them.
    external = [t for t in copy.graph.initializer if t.data_location == TensorProto.EXTERNAL]
    if external:
        inline = [t for t in copy.graph.initializer if t.data_location != TensorProto.EXTERNAL]
        del copy.graph.initializer[:]
        copy.graph.initializer.extend(inline)
        copy.graph.input.extend(
            helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)) for t in external
        )
    onnx.checker.check_model(copy, full_check=True)
