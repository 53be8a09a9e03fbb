"""SmolLM3's decoder layers (keras_hub's `SmolLM3DecoderLayer`): Llama-style, some of them NoPE.

What it adds to a Llama-style block: some layers use no RoPE at all (keras_hub's
`rope_layer_enabled_list[i]`, transformers' `no_rope_layers`: every fourth layer in the
published models), exported as `Attention.no_rope`; optional q/k/v biases
(`attention_bias`). Its kernels are `Dense` layers `(width, heads * head_dim)` and its
norms Keras's own `RMSNormalization`. keras_hub keeps `layer_types` but applies no window
whatever it says, so a type other than full attention is refused rather than exported
as either.
"""

from __future__ import annotations

import math

import keras
import numpy as np

from keras_posenc.export.decoder.description import Attention, Block, Mlp
from keras_posenc.export.errors import ExportError
from keras_posenc.keras_hub.common import array, rms_norm

_FULL_ATTENTION = ("attention", "full_attention")


def _dense(layer, owner: str, bias_allowed: bool) -> tuple[np.ndarray, np.ndarray | None]:
    if layer.activation is not keras.activations.linear:
        raise ExportError(f"{owner}: its Dense {layer.name!r} has an activation.")
    bias = None if layer.bias is None else array(layer.bias)
    if bias is not None and not bias_allowed:
        raise ExportError(
            f"{owner}: its MLP Dense {layer.name!r} has a bias (mlp_bias=True), which the "
            "export does not write."
        )
    return array(layer.kernel), bias


def smollm3_block(layer, max_length: int, owner: str) -> tuple[Block, object]:
    """`(Block, its rotary layer or None for a NoPE layer)` of a SmolLM3 decoder layer."""
    attention = layer.self_attn
    if layer.attention_type not in _FULL_ATTENTION:
        raise ExportError(
            f"{owner}: layer_types[{layer.layer_idx}]={layer.attention_type!r} is not "
            "exported: keras_hub's SmolLM3 keeps it but attends to every earlier token "
            "whatever it says, so the model and its config differ. Use 'full_attention'."
        )
    heads, kv_heads, head_dim = (
        attention.num_attention_heads,
        attention.num_key_value_heads,
        attention.head_dim,
    )
    query, query_bias = _dense(attention.q_proj, owner, True)
    key, key_bias = _dense(attention.k_proj, owner, True)
    value, value_bias = _dense(attention.v_proj, owner, True)
    if getattr(attention.o_proj, "bias", None) is not None:
        raise ExportError(f"{owner}: an attention output bias is not exported.")
    described = Attention(
        num_heads=heads,
        kv_num_heads=kv_heads,
        head_dim=head_dim,
        scale=1.0 / math.sqrt(head_dim),  # keras_hub's `_inv_norm_factor`
        query=query,
        key=key,
        value=value,
        output=array(attention.o_proj.kernel).reshape(heads * head_dim, -1),
        query_bias=query_bias,
        key_bias=key_bias,
        value_bias=value_bias,
    )
    mlp = Mlp(
        kind="swiglu",
        gate=_dense(layer.mlp.gate_proj, owner, False)[0],
        up=_dense(layer.mlp.up_proj, owner, False)[0],
        down=_dense(layer.mlp.down_proj, owner, False)[0],
    )
    block = Block(
        rms_norm(layer.input_layernorm, owner),
        described,
        rms_norm(layer.post_attention_layernorm, owner),
        mlp,
    )
    return block, attention.rotary_embedding if attention.use_rope else None
