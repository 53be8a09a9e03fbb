"""Gemma 4's text decoder blocks (keras_hub's `Gemma4TextDecoderBlock`), dense models.

What they add to Gemma 3's: the query scale 1 (the q/k norms replace 1/sqrt(head_dim)),
a value norm without a learned scale, norms that multiply by their scale itself (not
`1 + scale`), every block's four norms, its output times a `layer_scalar`, `K = V`
global layers (the value read from the key's kernel, before the key norm), and on
global layers proportional RoPE (`global_rope_partial_rotary_factor`: the first pairs of
each half rotated, the rest passed through) from their own base. The attention and
final soft caps, windows and GeGLU are Gemma's.

Refused, naming the setting (the export writes one cache per layer, every layer alike):
Mixture-of-Experts blocks (`enable_moe_block`), per-layer token inputs
(`hidden_size_per_layer_input`), layers reading another's keys and values
(`num_kv_shared_layers`), a `global_head_dim` or `num_global_key_value_heads` other than
the local layers', bidirectional attention (an embedder). A vision or audio encoder is
not part of the export (the text decoder is; images and audio are not fed).
"""

from __future__ import annotations

import numpy as np

from keras_posenc.export.decoder.description import Attention, Block, Mlp
from keras_posenc.export.errors import ExportError
from keras_posenc.keras_hub.common import array, rms_norm, unscaled_norm
from keras_posenc.keras_hub.rope import ProportionalRotary


def _kernel(layer, owner: str) -> np.ndarray:
    if getattr(layer, "bias", None) is not None:
        raise ExportError(f"{owner}: a bias in {layer.name!r} is not exported.")
    return array(layer.kernel)


def _refuse_unexported(layer, owner: str) -> None:
    attention = layer.attention
    settings = {
        "enable_moe_block": layer.enable_moe_block,  # a router and an expert bank
        "hidden_size_per_layer_input": layer.hidden_size_per_layer_input,
        "is_kv_shared_layer (num_kv_shared_layers)": layer.is_kv_shared_layer,
        "use_bidirectional_attention": layer.use_bidirectional_attention,
        "global_head_dim": layer.is_global_attention
        and layer.global_head_dim not in (None, layer.head_dim),
        "num_global_key_value_heads": attention.effective_num_kv_heads != layer.num_key_value_heads,
        "is_text_layer=False": not layer.is_text_layer,
    }
    used = [name for name, value in settings.items() if value]
    if used:
        raise ExportError(
            f"{owner}: Gemma4CausalLM with {', '.join(used)} is not exported (the dense "
            "text decoder with the same head sizes and one cache per layer is): "
            "Mixture-of-Experts, per-layer token inputs, shared key/value layers, global "
            "layers of other head sizes and bidirectional attention have no form in the "
            "export's decoder."
        )


def _attention(layer, max_length: int, owner: str) -> tuple[Attention, ProportionalRotary]:
    query = _kernel(layer.query_dense, owner)  # (heads, width, head_dim)
    key = _kernel(layer.key_dense, owner)
    # K = V: the value is the key's projection (before the key norm), normed as a value.
    value = key if layer.attention_k_eq_v else _kernel(layer.value_dense, owner)
    heads, width, head_dim = query.shape
    kv_heads = key.shape[0]
    window = layer.sliding_window_size if layer.use_sliding_window_attention else None
    attention = Attention(
        num_heads=heads,
        kv_num_heads=kv_heads,
        head_dim=head_dim,
        scale=1.0,  # keras_hub's `query_normalization`
        query=query.transpose(1, 0, 2).reshape(width, heads * head_dim),
        key=key.transpose(1, 0, 2).reshape(width, kv_heads * head_dim),
        value=value.transpose(1, 0, 2).reshape(width, kv_heads * head_dim),
        output=_kernel(layer.output_dense, owner).reshape(heads * head_dim, width),
        query_norm=rms_norm(layer.query_norm, owner),
        key_norm=rms_norm(layer.key_norm, owner),
        value_norm=unscaled_norm(layer.value_norm, head_dim, owner),
        window=None if window is None or window >= max_length else int(window),
        softcap=float(layer.logit_soft_cap or 0.0),
    )
    return attention, ProportionalRotary(layer.rope_layer, layer.rotary_dim, head_dim)


def gemma4_block(layer, max_length: int, owner: str) -> tuple[Block, object]:
    """`(Block, its RoPE)` of a Gemma 4 text decoder block (see the module docstring)."""
    _refuse_unexported(layer, owner)
    attention, rotary = _attention(layer.attention, max_length, owner)
    mlp = Mlp(
        kind="geglu",
        gate=_kernel(layer.gating_ffw, owner),
        up=_kernel(layer.gating_ffw_2, owner),
        down=_kernel(layer.ffw_linear, owner),
    )
    block = Block(
        rms_norm(layer.pre_attention_norm, owner),
        attention,
        rms_norm(layer.pre_ffw_norm, owner),
        mlp,
        post_attention_norm=rms_norm(layer.post_attention_norm, owner),
        post_mlp_norm=rms_norm(layer.post_ffw_norm, owner),
        output_scale=float(array(layer.layer_scalar)),
    )
    return block, rotary
