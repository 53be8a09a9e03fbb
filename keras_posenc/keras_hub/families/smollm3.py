"""SmolLM3 (keras_hub's `SmolLM3CausalLM`): Llama-style decoder layers, some of them NoPE.

What it adds to a Llama-style block: some layers use no RoPE at all (keras_hub's
`rope_layer_enabled_list[i]`, transformers' `no_rope_layers`: every fourth layer in the
published models), exported as `Attention.no_rope`; optional q/k/v biases
(`attention_bias`). Its kernels are `Dense` layers `(width, heads * head_dim)` and its
norms Keras's own `RMSNormalization`. keras_hub keeps `layer_types` but applies no window
whatever it says, so a type other than full attention is refused rather than exported
as either. Its `SmolLM3RotaryEmbedding` returns its cos/sin rows rather than rotating.
"""

from __future__ import annotations

import math

import keras
import numpy as np

from keras_posenc.export.decoder.description import Attention, Block, Mlp, Rope
from keras_posenc.export.decoder.keras_quantized import kernel_of
from keras_posenc.export.errors import ExportError
from keras_posenc.keras_hub.family import HubFamily, RotaryReader
from keras_posenc.keras_hub.layer_readers import array, rms_norm

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
    return kernel_of(layer, owner), bias


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
        output=kernel_of(attention.o_proj, owner).reshape(heads * head_dim, -1),
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


def _rotary_settings(layer, owner: str) -> tuple[float, None]:
    if layer.partial_rotary_factor != 1.0 or layer.attention_scaling != 1.0:
        raise ExportError(
            f"{owner}: partial_rotary_factor={layer.partial_rotary_factor} is not "
            "exported: keras_hub's SmolLM3 attention multiplies the whole head by its "
            "cos/sin rows, which are that fraction of the head wide, so it does not run "
            "with another value than 1.0."
        )
    return float(layer.rope_theta), None


def _rotary_rows(layer, head_dim: int, max_length: int) -> Rope:
    """The cos/sin rows the layer returns."""
    import keras

    half = head_dim // 2
    probe = np.zeros((1, max_length, 1, head_dim), np.float32)
    cos, sin = (keras.ops.convert_to_numpy(t)[0, :, :half] for t in layer(probe, start_index=0))
    return Rope(cos=np.ascontiguousarray(cos), sin=np.ascontiguousarray(sin), interleaved=False)


SMOLLM3 = HubFamily(
    causal_lm="SmolLM3CausalLM",
    backbone="SmolLM3Backbone",
    read_block=smollm3_block,
    read_keys=frozenset(
        {
            "num_attention_heads",
            "attention_bias",
            "attention_dropout",
            "rope_layer_enabled_list",
            "layer_types",
            "mlp_bias",
            "max_position_embeddings",
            "rope_theta",
            "partial_rotary_factor",
        }
    ),
    rotaries={"SmolLM3RotaryEmbedding": RotaryReader(_rotary_settings, _rotary_rows)},
)
