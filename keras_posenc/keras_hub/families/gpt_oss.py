"""GPT-OSS (keras_hub's `GptOssCausalLM`): its decoder block (`GptOssTransformerDecoder`).

What it adds to a Llama-style block: q/k/v and output biases, per-head attention sinks
(a learned logit joining each head's softmax, its weight dropped), a sliding window on
every other layer (keras_hub's odd layers), YaRN RoPE (keras_hub's `RotaryEmbedding`,
read in `rotary_layers.py`) and a mixture-of-experts MLP: a biased router, the softmax
of each token's top-k router logits as the weights of its experts, and experts with a
clamped SwiGLU variant,
`(clip(up, -limit, limit) + 1) · g · sigmoid(alpha · g)` with `g = clip(gate, -1e9,
limit)`, their gate and up columns interleaved in one kernel (`gate_up_proj[..., ::2]`
the gate, `[..., 1::2]` the up).

keras_hub's window lets the query at slot i see the keys at slots j >= i - sliding_window
(`sliding_window + 1` keys with its own), the slots being positions since keras_hub keeps
a row's tokens from slot 0; the description counts the query's own key in its window.
"""

from __future__ import annotations

import math

import numpy as np

from keras_posenc.export.decoder.description import Attention, Block, Moe
from keras_posenc.export.errors import ExportError
from keras_posenc.keras_hub import private
from keras_posenc.keras_hub.family import HubFamily
from keras_posenc.keras_hub.layer_readers import array, flat_bias, rms_norm

_NORMS = ("GptOssLayerNormalization",)


def _attention(layer, max_length: int, owner: str) -> Attention:
    query = array(layer.query_dense.kernel)  # (width, heads, head_dim)
    key = array(layer.key_dense.kernel)
    width, heads, head_dim = query.shape
    kv_heads = key.shape[1]
    if private.gpt_oss_rotary_dim(layer) != head_dim:
        raise ExportError(
            f"{owner}: an odd head_dim ({head_dim}) leaves a channel unrotated; the export "
            "rotates every channel of GPT-OSS's heads."
        )
    window = layer.sliding_window if layer.sliding_window and layer.sliding_window > 0 else None
    if window is not None:
        window += 1  # the query's own key too (see the module docstring)
    return Attention(
        num_heads=heads,
        kv_num_heads=kv_heads,
        head_dim=head_dim,
        scale=1.0 / math.sqrt(head_dim),  # keras_hub's `_inv_norm_factor`
        query=query.reshape(width, heads * head_dim),
        key=key.reshape(width, kv_heads * head_dim),
        value=array(layer.value_dense.kernel).reshape(width, kv_heads * head_dim),
        output=array(layer.output_dense.kernel).reshape(heads * head_dim, width),
        query_bias=flat_bias(layer.query_dense),
        key_bias=flat_bias(layer.key_dense),
        value_bias=flat_bias(layer.value_dense),
        output_bias=flat_bias(layer.output_dense),
        sinks=array(layer.sinks),
        window=None if window is None or window >= max_length else int(window),
    )


def _moe(block, owner: str) -> Moe:
    router = block.router.router_dense
    if router.activation.__name__ != "linear":
        raise ExportError(f"{owner}: its router has an activation; its logits are linear.")
    experts = block.experts
    gate_up = array(experts.gate_up_proj)  # (experts, width, 2 * intermediate), interleaved
    gate_up_bias = array(experts.gate_up_proj_bias)
    width = gate_up.shape[1]
    return Moe(
        router=array(router.kernel),
        router_bias=(
            np.zeros(block.num_experts, np.float32) if router.bias is None else array(router.bias)
        ),
        top_k=int(block.top_k),
        gate=np.ascontiguousarray(gate_up[..., ::2]),
        gate_bias=np.ascontiguousarray(gate_up_bias[..., ::2]),
        up=np.ascontiguousarray(gate_up[..., 1::2]),
        up_bias=np.ascontiguousarray(gate_up_bias[..., 1::2]),
        down=array(experts.down_proj),
        down_bias=array(experts.down_proj_bias).reshape(-1, width),
        alpha=float(experts.alpha),
        limit=float(experts.limit),
    )


def gpt_oss_block(layer, max_length: int, owner: str) -> tuple[Block, object]:
    """`(Block, the layer's rotary layer)` of a `GptOssTransformerDecoder`."""
    if layer.dropout:
        raise ExportError(f"{owner}: dropout={layer.dropout}; export an inference model (0).")
    attention = layer.self_attention_layer
    block = Block(
        rms_norm(layer.input_layernorm, owner, _NORMS),
        _attention(attention, max_length, owner),
        rms_norm(layer.post_attention_layernorm, owner, _NORMS),
        _moe(layer.sparse_moe_block, owner),
    )
    return block, attention.rotary_embedding_layer


GPT_OSS = HubFamily(
    causal_lm="GptOssCausalLM",
    backbone="GptOssBackbone",
    read_block=gpt_oss_block,
    read_keys=frozenset(
        {
            "num_query_heads",
            "num_experts",
            "top_k",
            "rope_max_wavelength",
            "rope_scaling_factor",
            "sliding_window",
            "head_dim",
            "output_router_logits",  # what `call` returns besides the logits, not the logits
        }
    ),
    norms=_NORMS,
)
