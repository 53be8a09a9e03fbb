"""Gemma (1, 2) and Gemma 3 (keras_hub's `GemmaCausalLM`, `Gemma3CausalLM`) and their blocks.

What they add to a Llama-style block: kernels laid out `(heads, width, head_dim)`, norms
`x · (1 + scale)`, a GeGLU MLP with tanh GELU, the query scale `1/sqrt(head_dim)` or
`1/sqrt(width / heads)` (`query_head_dim_normalize`), soft-capped scores, sliding windows
per layer, post-attention and post-MLP norms (Gemma 2, Gemma 3), per-head q/k norms and
per-layer RoPE wavelengths (Gemma 3's local and global layers). Gemma's attention rotates
halves and then interleaves the halves of both q and k: the same permutation of both,
so the scores are those of plain half-layout RoPE, which is what is exported. Their
embedded tokens are scaled by `sqrt(hidden_dim)`; Gemma 3's cache is a `(key, value)`
pair per layer.
"""

from __future__ import annotations

import numpy as np

from keras_posenc.export.decoder.description import Attention, Block, Mlp
from keras_posenc.export.decoder.keras_quantized import kernel_of
from keras_posenc.export.errors import ExportError
from keras_posenc.keras_hub import kv_caches
from keras_posenc.keras_hub.family import HubFamily
from keras_posenc.keras_hub.layer_readers import rms_norm

# The keys of keras_hub 0.32's Gemma and Gemma 3 backbone configs the readers read.
GEMMA_READ_KEYS = frozenset(
    {
        "num_query_heads",
        "head_dim",
        "query_head_dim_normalize",
        "use_post_ffw_norm",
        "use_post_attention_norm",
        "attention_logit_soft_cap",
        "final_logit_soft_cap",
        "use_sliding_window_attention",
        "sliding_window_size",
    }
)
GEMMA3_READ_KEYS = GEMMA_READ_KEYS | {
    "image_size",
    "use_query_key_norm",
    "local_rope_scaling_factor",
    "global_rope_scaling_factor",
    "vision_encoder",
    "use_bidirectional_attention",
    "is_embedding_model",
    "pooling_intermediate_dim",
    "embedding_dim",
}


def kernel(layer, owner: str) -> np.ndarray:
    """A bias-free Dense or EinsumDense kernel of a Gemma block (a bias is refused)."""
    if getattr(layer, "bias", None) is not None:
        raise ExportError(f"{owner}: a bias in {layer.name!r} is not exported.")
    return kernel_of(layer, owner)


def geglu_mlp(layer, owner: str) -> Mlp:
    """The GeGLU MLP every Gemma block has, under the same names (Gemma 1 to 4)."""
    return Mlp(
        kind="geglu",
        gate=kernel(layer.gating_ffw, owner),
        up=kernel(layer.gating_ffw_2, owner),
        down=kernel(layer.ffw_linear, owner),
    )


def _attention(layer, max_length: int, owner: str) -> Attention:
    if getattr(layer, "use_bidirectional_attention", False):
        raise ExportError(f"{owner}: bidirectional attention (an embedder) does not decode.")
    query = kernel(layer.query_dense, owner)  # (heads, width, head_dim)
    key = kernel(layer.key_dense, owner)
    value = kernel(layer.value_dense, owner)
    heads, width, head_dim = query.shape
    kv_heads = key.shape[0]
    if layer.query_head_dim_normalize:
        scale = 1 / np.sqrt(head_dim)
    else:
        scale = 1 / np.sqrt(layer.hidden_dim // heads)
    use_norms = getattr(layer, "use_query_key_norm", False)
    window = layer.sliding_window_size if layer.use_sliding_window_attention else None
    return Attention(
        num_heads=heads,
        kv_num_heads=kv_heads,
        head_dim=head_dim,
        scale=float(np.float32(scale)),  # keras_hub multiplies q by it in float32
        query=query.transpose(1, 0, 2).reshape(width, heads * head_dim),
        key=key.transpose(1, 0, 2).reshape(width, kv_heads * head_dim),
        value=value.transpose(1, 0, 2).reshape(width, kv_heads * head_dim),
        output=kernel(layer.output_dense, owner).reshape(heads * head_dim, width),
        query_norm=rms_norm(layer.query_norm, owner) if use_norms else None,
        key_norm=rms_norm(layer.key_norm, owner) if use_norms else None,
        window=None if window is None or window >= max_length else int(window),
        softcap=float(layer.logit_soft_cap or 0.0),
    )


def gemma_block(layer, max_length: int, owner: str) -> tuple[Block, object]:
    """`(Block, the layer's rotary layer)` of a Gemma or Gemma 3 decoder block."""
    if layer.query_head_dim_normalize != layer.attention.query_head_dim_normalize:
        raise ExportError(
            f"{owner}: query_head_dim_normalize={layer.query_head_dim_normalize} is not "
            "exported: keras_hub's decoder block keeps it but builds its attention with "
            f"{layer.attention.query_head_dim_normalize} (the query is scaled by "
            "1/sqrt(head_dim) whatever the config says), so the model and its config "
            "differ. Set it to True to export what keras_hub computes."
        )
    attention = _attention(layer.attention, max_length, owner)
    mlp = geglu_mlp(layer, owner)
    block = Block(
        rms_norm(layer.pre_attention_norm, owner),
        attention,
        rms_norm(layer.pre_ffw_norm, owner),
        mlp,
        post_attention_norm=(
            rms_norm(layer.post_attention_norm, owner) if layer.use_post_attention_norm else None
        ),
        post_mlp_norm=rms_norm(layer.post_ffw_norm, owner) if layer.use_post_ffw_norm else None,
    )
    return block, layer.attention.rope_layer


GEMMA = HubFamily(
    causal_lm="GemmaCausalLM",
    backbone="GemmaBackbone",
    read_block=gemma_block,
    read_keys=GEMMA_READ_KEYS,
    embedding_scaled=True,
)
GEMMA3 = HubFamily(
    causal_lm="Gemma3CausalLM",
    backbone="Gemma3Backbone",
    read_block=gemma_block,
    read_keys=GEMMA3_READ_KEYS,
    embedding_scaled=True,
    empty_cache=kv_caches.layer_pairs_cache,
)
