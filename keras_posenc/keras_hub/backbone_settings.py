"""A keras_hub backbone's settings the bridge was not written for, refused by name.

The block readers (`describe.py`, `gemma.py`, ...) read every setting of the keras_hub
0.32 backbones of `FAMILIES` from the layers (and refuse the ones the export cannot write,
by name). A backbone whose config holds another key (a later keras_hub's new option, a
subclass's own) set to something other than its constructor's default would be read
without it: refused, naming the key and value, before any work.
"""

from __future__ import annotations

from keras_posenc.export.decoder.settings import unread_settings
from keras_posenc.export.errors import ExportError

_LLAMA = {
    "num_query_heads",
    "rope_max_wavelength",
    "rope_position_scaling_factor",
    "rope_frequency_adjustment_factor",
    "rope_low_freq_factor",
    "rope_high_freq_factor",
    "rope_pretraining_sequence_length",
    "tie_word_embeddings",
}
_GEMMA = {
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
_GEMMA3 = {
    *_GEMMA,
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
# The keys of keras_hub 0.32's backbone configs the readers read (besides the ones every
# backbone has), by backbone class.
READ_KEYS = {
    "LlamaBackbone": _LLAMA,
    "Llama3Backbone": _LLAMA,
    "MistralBackbone": {
        "num_query_heads",
        "rope_max_wavelength",
        "rope_scaling_factor",
        "sliding_window",
        "head_dim",
    },
    "QwenBackbone": {
        "num_query_heads",
        "rope_max_wavelength",
        "rope_scaling_factor",
        "tie_word_embeddings",
        "use_sliding_window_attention",
        "sliding_window_size",
    },
    "Qwen3Backbone": {
        "num_query_heads",
        "head_dim",
        "rope_max_wavelength",
        "rope_scaling_factor",
        "tie_word_embeddings",
        "sliding_window_size",
    },
    "Phi3Backbone": {
        "num_query_heads",
        "max_sequence_length",
        "pretraining_sequence_length",
        "rope_max_wavelength",
        "rope_scaling_type",
        "rope_scaling_short_factor",
        "rope_scaling_long_factor",
    },
    "GemmaBackbone": _GEMMA,
    "Gemma3Backbone": _GEMMA3,
    "SmolLM3Backbone": {
        "num_attention_heads",
        "attention_bias",
        "attention_dropout",
        "rope_layer_enabled_list",
        "layer_types",
        "mlp_bias",
        "max_position_embeddings",
        "rope_theta",
        "partial_rotary_factor",
    },
    "Gemma4Backbone": {
        *_GEMMA3,
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
    "GptOssBackbone": {
        "num_query_heads",
        "num_experts",
        "top_k",
        "rope_max_wavelength",
        "rope_scaling_factor",
        "sliding_window",
        "head_dim",
        "output_router_logits",  # what `call` returns besides the logits, not the logits
    },
}
_EVERY_BACKBONE = {
    "vocabulary_size",
    "num_layers",
    "hidden_dim",
    "intermediate_dim",
    "num_key_value_heads",
    "layer_norm_epsilon",
}


def refuse_unread_backbone_settings(backbone, owner: str) -> None:
    """Raises an ExportError naming each setting of `backbone`'s config that is not
    one the bridge reads and differs from the constructor's default.

    Raises:
        ExportError: such a setting.
    """
    known = next(
        (READ_KEYS[cls.__name__] for cls in type(backbone).__mro__ if cls.__name__ in READ_KEYS),
        None,
    )
    if known is None:  # not a backbone of `FAMILIES`: its CausalLM was refused already
        return
    unread = unread_settings(backbone, known | _EVERY_BACKBONE)
    if unread:
        settings = ", ".join(f"{key}={value!r}" for key, value in unread.items())
        raise ExportError(
            f"{owner} has settings save_decoder does not read: {settings}. The file would "
            "compute without them; export a model without them (or at their defaults)."
        )
