"""Gemma 4's text decoder blocks (keras_hub's `Gemma4TextDecoderBlock`), dense models.

What they add to Gemma 3's: the query scale 1 (the q/k norms replace 1/sqrt(head_dim)),
a value norm without a learned scale, norms that multiply by their scale itself (not
`1 + scale`), every block's four norms, its output times a `layer_scalar`, `K = V`
global layers (the value read from the key's kernel, before the key norm), and on
global layers proportional RoPE (`global_rope_partial_rotary_factor`: the first pairs of
each half rotated, the rest passed through) from their own base. The attention and
final soft caps, windows and GeGLU are Gemma's.

What the published checkpoints add: global layers of their own head size and K/V head
count (`global_head_dim`, `num_global_key_value_heads`: 31B), the last
`num_kv_shared_layers` layers reading the cache of the last earlier layer of their kind
(`kv_shared_layer_index`; E2B, E4B), their MLPs twice as wide (`use_double_wide_mlp`),
and per-layer embeddings (`hidden_size_per_layer_input`, `gemma4_per_layer_inputs`).

Refused, naming the setting: Mixture-of-Experts blocks (`enable_moe_block`, 26B-A4B),
layers that all share an outside cache (the assistant model, `num_kv_shared_layers ==
num_layers`), bidirectional attention (an embedder). A vision or audio encoder is not
part of the export (the text decoder is; images and audio are not fed).
"""

from __future__ import annotations

import numpy as np

from keras_posenc.export.decoder.description import (
    Attention,
    Block,
    PerLayerGate,
    PerLayerInputs,
)
from keras_posenc.export.errors import ExportError
from keras_posenc.keras_hub.common import array, rms_norm, unscaled_norm
from keras_posenc.keras_hub.gemma import geglu_mlp, kernel
from keras_posenc.keras_hub.rope import ProportionalRotary


def _refuse_unexported(layer, owner: str) -> None:
    settings = {
        "enable_moe_block": layer.enable_moe_block,  # a router and an expert bank
        "is_kv_shared_layer without a kv_shared_layer_index (every layer sharing an "
        "outside cache: the assistant model)": layer.is_kv_shared_layer
        and layer.kv_shared_layer_index is None,
        "use_bidirectional_attention": layer.use_bidirectional_attention,
        "is_text_layer=False": not layer.is_text_layer,
    }
    used = [name for name, value in settings.items() if value]
    if used:
        raise ExportError(
            f"{owner}: Gemma4CausalLM with {', '.join(used)} is not exported (the dense "
            "text decoder is, with its per-layer head sizes, shared key/value layers and "
            "per-layer inputs): Mixture-of-Experts, an outside cache and bidirectional "
            "attention have no form in the export's decoder."
        )


def _attention(layer, block, max_length: int, owner: str) -> tuple[Attention, ProportionalRotary]:
    query = kernel(layer.query_dense, owner)  # (heads, width, head_dim)
    heads, width, head_dim = query.shape
    kv_heads = layer.effective_num_kv_heads
    window = layer.sliding_window_size if layer.use_sliding_window_attention else None
    if layer.is_kv_shared_layer:  # no keys or values of its own: the source layer's
        empty = np.zeros((width, 0), np.float32)
        own = dict(key=empty, value=empty, kv_source=int(block.kv_shared_layer_index))
    else:
        key = kernel(layer.key_dense, owner)
        # K = V: the value is the key's projection (before the key norm), normed as a value.
        value = key if layer.attention_k_eq_v else kernel(layer.value_dense, owner)
        own = dict(
            key=key.transpose(1, 0, 2).reshape(width, kv_heads * head_dim),
            value=value.transpose(1, 0, 2).reshape(width, kv_heads * head_dim),
            key_norm=rms_norm(layer.key_norm, owner),
            value_norm=unscaled_norm(layer.value_norm, head_dim, owner),
        )
    attention = Attention(
        num_heads=heads,
        kv_num_heads=kv_heads,
        head_dim=head_dim,
        scale=1.0,  # keras_hub's `query_normalization`
        query=query.transpose(1, 0, 2).reshape(width, heads * head_dim),
        output=kernel(layer.output_dense, owner).reshape(heads * head_dim, width),
        query_norm=rms_norm(layer.query_norm, owner),
        window=None if window is None or window >= max_length else int(window),
        softcap=float(layer.logit_soft_cap or 0.0),
        **own,
    )
    return attention, ProportionalRotary(layer.rope_layer, layer.rotary_dim, head_dim)


def _per_layer_gate(layer, owner: str) -> PerLayerGate | None:
    if not layer.hidden_size_per_layer_input:
        return None
    return PerLayerGate(
        gate=kernel(layer.per_layer_input_gate, owner),
        up=kernel(layer.per_layer_up_proj, owner),
        norm=rms_norm(layer.post_per_layer_input_norm, owner),
    )


def gemma4_per_layer_inputs(backbone, owner: str) -> PerLayerInputs | None:
    """Gemma 4's per-layer embeddings (E2B, E4B) with keras_hub's float32 constants, or
    None without them (`hidden_size_per_layer_input` 0)."""
    width = getattr(backbone, "hidden_size_per_layer_input", 0)
    if not width:
        return None
    return PerLayerInputs(
        embedding=array(backbone.per_layer_token_embedding.embeddings),
        embedding_scale=float(np.float32(float(width) ** 0.5)),
        projection=kernel(backbone.per_layer_model_projection, owner),
        projection_scale=float(np.float32(float(backbone.hidden_dim) ** -0.5)),
        norm=rms_norm(backbone.per_layer_projection_norm, owner),
        combine_scale=float(np.float32(2.0**-0.5)),
    )


def gemma4_block(layer, max_length: int, owner: str) -> tuple[Block, object]:
    """`(Block, its RoPE)` of a Gemma 4 text decoder block (see the module docstring)."""
    _refuse_unexported(layer, owner)
    attention, rotary = _attention(layer.attention, layer, max_length, owner)
    mlp = geglu_mlp(layer, owner)
    block = Block(
        rms_norm(layer.pre_attention_norm, owner),
        attention,
        rms_norm(layer.pre_ffw_norm, owner),
        mlp,
        post_attention_norm=rms_norm(layer.post_attention_norm, owner),
        post_mlp_norm=rms_norm(layer.post_ffw_norm, owner),
        output_scale=float(array(layer.layer_scalar)),
        per_layer_gate=_per_layer_gate(layer, owner),
    )
    return block, rotary
