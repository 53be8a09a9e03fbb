"""`genai_config.json`: what onnxruntime-genai's `og.Model(folder)` reads to run `model.onnx`."""

from __future__ import annotations

from keras_posenc.export.decoder.description import Decoder
from keras_posenc.export.decoder.genai_interface import (
    SHARE_BUFFER,
    config_inputs,
    config_outputs,
)


def genai_config(
    decoder: Decoder,
    filename: str = "model.onnx",
    *,
    bos_token_id: int = 0,
    eos_token_id: int | list[int] | None = None,
    pad_token_id: int = 0,
) -> dict:
    """The config the genai model builder writes for a Llama-style decoder of `decoder`.

    Greedy search over at most `max_length` tokens (prompt included), one cache buffer per
    layer shared by past and present (`past_present_share_buffer`). `eos_token_id` None:
    the padding token's id (genai needs one inside the vocabulary).
    """
    attention = decoder.attention
    eos = pad_token_id if eos_token_id is None else eos_token_id
    return {
        "model": {
            "bos_token_id": bos_token_id,
            "context_length": decoder.max_length,
            "decoder": {
                "session_options": {"log_id": "onnxruntime-genai", "provider_options": []},
                "filename": filename,
                "head_size": attention.head_dim,
                "hidden_size": decoder.width,
                "inputs": config_inputs(),
                "outputs": config_outputs(),
                "num_attention_heads": attention.num_heads,
                "num_hidden_layers": decoder.num_layers,
                "num_key_value_heads": attention.kv_num_heads,
            },
            "eos_token_id": eos,
            "pad_token_id": pad_token_id,
            "type": "llama",
            "vocab_size": decoder.vocabulary,
        },
        "search": {
            "diversity_penalty": 0.0,
            "do_sample": False,
            "early_stopping": True,
            "length_penalty": 1.0,
            "max_length": decoder.max_length,
            "min_length": 0,
            "no_repeat_ngram_size": 0,
            "num_beams": 1,
            "num_return_sequences": 1,
            "past_present_share_buffer": SHARE_BUFFER,
            "repetition_penalty": 1.0,
            "temperature": 1.0,
            "top_k": 1,
            "top_p": 1.0,
        },
    }
