"""Gemma 4 (keras_hub's `Gemma4CausalLM`): its text decoder blocks, dense models.

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

import dataclasses

import numpy as np

from keras_posenc.export.decoder.description import (
    Attention,
    Block,
    PerLayerGate,
    PerLayerInputs,
    Rope,
)
from keras_posenc.export.errors import ExportError
from keras_posenc.keras_hub.families.gemma import GEMMA3_READ_KEYS, geglu_mlp, kernel
from keras_posenc.keras_hub.family import HubFamily, RotaryReader
from keras_posenc.keras_hub.layer_readers import array, rms_norm, unscaled_norm
from keras_posenc.keras_hub.rotary_layers import probe_rows


@dataclasses.dataclass(frozen=True)
class ProportionalRotary:
    """Gemma 4's RoPE: keras_hub's `RotaryEmbedding` (`denominator_dim=head_dim`) applied
    to the first `rotary_dim / 2` channels of each half of the head, the rest passed
    through: transformers' `proportional` RoPE, a full-head table whose last pairs turn
    by 0 (cos 1, sin 0, exact)."""

    layer: object
    rotary_dim: int
    head_dim: int


def _proportional_settings(rotary: ProportionalRotary, owner: str) -> tuple[float, dict | None]:
    layer = rotary.layer
    if type(layer).__name__ != "RotaryEmbedding" or layer.rope_type != "linear":
        raise ExportError(
            f"{owner}: its RoPE layer {type(layer).__name__} is not one the export reads."
        )
    if (layer.sequence_axis, layer.feature_axis) != (1, -1):
        raise ExportError(f"{owner}: a RoPE layer with other axes than (1, -1) is not exported.")
    if layer.denominator_dim not in (None, rotary.head_dim):
        raise ExportError(
            f"{owner}: a RoPE denominator_dim={layer.denominator_dim} other than head_dim "
            f"({rotary.head_dim}) is not exported."
        )
    wavelength, factor = float(layer.max_wavelength), float(layer.scaling_factor)
    if rotary.rotary_dim == rotary.head_dim:
        return wavelength, None if factor == 1.0 else {"rope_type": "linear", "factor": factor}
    return wavelength, {
        "rope_type": "proportional",
        "factor": factor,
        "partial_rotary_factor": rotary.rotary_dim / rotary.head_dim,
    }


def _proportional_rows(rotary: ProportionalRotary, head_dim: int, max_length: int) -> Rope:
    """keras_hub's rows: the rotated pairs, then the unrotated ones."""
    rows = probe_rows(rotary.layer, rotary.rotary_dim, max_length)
    rest = (max_length, (head_dim - rotary.rotary_dim) // 2)
    return Rope(
        cos=np.concatenate([rows.cos, np.ones(rest, np.float32)], axis=1),
        sin=np.concatenate([rows.sin, np.zeros(rest, np.float32)], axis=1),
        interleaved=False,
    )


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


GEMMA4 = HubFamily(
    causal_lm="Gemma4CausalLM",
    backbone="Gemma4Backbone",
    read_block=gemma4_block,
    read_keys=GEMMA3_READ_KEYS
    | {
        "sliding_window_pattern",
        "layer_types",
        "global_head_dim",
        "audio_encoder",
        "num_audio_tokens_per_clip",
        "use_vision_bidirectional_attention",
        "num_kv_shared_layers",
        "num_global_key_value_heads",
        "hidden_size_per_layer_input",
        "vocab_size_per_layer_input",
        "global_rope_wavelength",
        "local_rope_wavelength",
        "global_rope_partial_rotary_factor",
        "use_double_wide_mlp",
        "enable_moe_block",
        "num_experts",
        "expert_intermediate_dim",
        "num_experts_per_token",
    },
    rotaries={
        ProportionalRotary.__name__: RotaryReader(_proportional_settings, _proportional_rows)
    },
    embedding_scaled=True,
    per_layer_inputs=gemma4_per_layer_inputs,
)
