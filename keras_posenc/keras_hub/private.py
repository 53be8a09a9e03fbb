"""Every private attribute of keras_hub the bridge reads, each behind a named function.

Nothing else in the bridge reads a `_`-attribute of a keras_hub object: when a release
renames one, this is the one file to change (as `keras_posenc._tf.private` is for
TensorFlow). Each says why no public attribute serves: keras_hub 0.32 keeps these
sublayers and settings only under private names.
"""

from __future__ import annotations

# The sublayers of keras_hub's Llama-style decoder blocks (`LlamaTransformerDecoder`,
# Mistral's, Qwen's, Qwen 3's) and their attention layers, by part.
_LLAMA_PARTS = dict(
    attention_norm="_self_attention_layernorm",
    attention="_self_attention_layer",
    mlp_norm="_feedforward_layernorm",
    gate="_feedforward_gate_dense",
    up="_feedforward_intermediate_dense",
    down="_feedforward_output_dense",
    query="_query_dense",
    key="_key_dense",
    value="_value_dense",
    output="_output_dense",
)


def llama_part(layer, part: str):
    """Part `part` (a key of `_LLAMA_PARTS`) of a Llama-style block or its attention."""
    return getattr(layer, _LLAMA_PARTS[part])


def query_key_norm(attention, part: str):
    """Qwen 3's per-head norm of `part` ("query" or "key") of a Llama-style attention
    layer, or None (the other families have none)."""
    return getattr(attention, f"_{part}_dense_layer_norm", None)


def mistral_sliding_window(attention) -> int | None:
    """`MistralAttention`'s window (the backbone's `sliding_window`), None for none."""
    return attention._sliding_window


def gpt_oss_rotary_dim(attention) -> int:
    """The channels of each head `GptOssAttention` rotates (`head_dim` rounded down to even)."""
    return attention._rotary_dim
