"""Attention config keys: `from_transformers_config` computes them as transformers, or refuses.

The keys besides heads, RoPE and q/k norms that change a family's attention output in
transformers 5.24 (docs/configs.md): biases, sliding windows and Qwen3-Next's output gate
are read and checked against the family's own attention module (a tiny random model run
once, a forward hook taking each layer's input and output, weights copied over, biases
included), without and with a cache; the keys these layers do not compute are refused with
the family, the key and its value, and their neutral values read.
"""

from __future__ import annotations

import numpy as np
import pytest
from attention_parity import (
    SIZES,
    assert_other_attention,
    assert_same_attention,
    cached_outputs,
    copy_weights,
    transformers_side,
)

from keras_posenc import RotaryGroupQueryAttention, RotaryMultiHeadAttention
from keras_posenc.configs.arguments import attention_arguments
from keras_posenc.configs.families import FAMILIES

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

LENGTH, PREFILL, WINDOW = 8, 5, 3  # the window is shorter than the prefill and the sequence
CASES = {
    "mistral": {"num_hidden_layers": 1, "sliding_window": WINDOW},
    # Layer 0 full, layer 1 sliding (i >= max_window_layers); q/k/v biases always.
    "qwen2": {
        "num_hidden_layers": 2,
        "use_sliding_window": True,
        "sliding_window": WINDOW,
        "max_window_layers": 1,
    },
    "gemma3_text": {
        "num_hidden_layers": 2,
        "layer_types": ["sliding_attention", "full_attention"],
        "sliding_window": WINDOW,
        "query_pre_attn_scalar": 16,  # head_dim: the scale these layers have
        "attention_bias": True,
    },
    "llama": {"num_hidden_layers": 1, "attention_bias": True},
    "qwen3_next": {  # its gated attention (q_proj gives the queries and the gate)
        "num_hidden_layers": 1,
        "layer_types": ["full_attention"],
        "num_experts": 2,
        "num_experts_per_tok": 1,
        "moe_intermediate_size": 32,
        "shared_expert_intermediate_size": 32,
    },
}
# What each case must read besides heads and RoPE, per layer.
READ = {
    ("mistral", 0): {"sliding_window": WINDOW, "use_bias": False},
    ("qwen2", 0): {"use_bias": True},
    ("qwen2", 1): {"sliding_window": WINDOW, "use_bias": True},
    ("gemma3_text", 0): {"sliding_window": WINDOW, "use_bias": True},
    ("gemma3_text", 1): {"use_bias": True},
    ("llama", 0): {"use_bias": True},
    ("qwen3_next", 0): {"use_gate": True, "use_bias": False},
}


@pytest.fixture(scope="module", params=sorted(CASES))
def side(request):
    raw = {"model_type": request.param, **SIZES, **CASES[request.param]}
    return raw, transformers_side(raw, LENGTH)


def test_the_keys_are_read(side):
    raw, seen = side
    for index in seen:
        arguments = attention_arguments(raw, layer_index=index)
        expected = READ[raw["model_type"], index]
        for key in ("sliding_window", "use_bias", "use_gate"):
            assert arguments.get(key) == expected.get(key), (raw["model_type"], index, key)


def test_attention_equals_transformers(side):
    raw, seen = side
    assert seen, "the model ran no attention"
    for index, (module, x, expected) in seen.items():
        layer = RotaryGroupQueryAttention.from_transformers_config(raw, layer_index=index)
        copy_weights(layer, module, x)
        output = np.asarray(layer(x, x, use_causal_mask=True))
        assert_same_attention(output, module, x, expected)
        assert_same_attention(cached_outputs(layer, x, PREFILL), module, x)


def test_without_the_window_the_attention_differs(side):
    """The check can fail: a layer without its window is other attention here."""
    raw, seen = side
    for index, (module, x, _) in seen.items():
        if "sliding_window" not in READ[raw["model_type"], index]:
            continue
        layer = RotaryGroupQueryAttention.from_transformers_config(
            raw, layer_index=index, sliding_window=None
        )
        copy_weights(layer, module, x)
        assert_other_attention(layer(x, x, use_causal_mask=True), module, x)


def test_multi_head_attention_reads_the_window_and_bias():
    raw = {"model_type": "mistral", **SIZES, "num_key_value_heads": 4, "sliding_window": 3}
    layer = RotaryMultiHeadAttention.from_transformers_config(raw)
    assert layer._window() == 3 and not layer._use_bias


MISTRAL = {"model_type": "mistral", **SIZES}
GEMMA2 = {"model_type": "gemma2", **SIZES, "num_hidden_layers": 2}
SLIDING_FULL = ["sliding_attention", "full_attention"]
MODERNBERT = {
    "model_type": "modernbert",
    **SIZES,
    "num_hidden_layers": 2,
    "layer_types": ["full_attention", "sliding_attention"],
}


@pytest.mark.parametrize(
    ("config", "match"),
    [
        (GEMMA2, r"gemma2 config has attn_logit_softcapping=50\.0.*null"),
        (
            {**GEMMA2, "attn_logit_softcapping": None},
            r"query_pre_attn_scalar=256.*head_dim \(16\)",
        ),
        (  # Gemma 3 27B: head_dim 128, scale 168 ** -0.5
            {
                "model_type": "gemma3_text",
                **SIZES,
                "num_hidden_layers": 2,
                "head_dim": 128,
                "query_pre_attn_scalar": 168,
                "layer_types": SLIDING_FULL,
            },
            r"gemma3_text config has query_pre_attn_scalar=168",
        ),
        (
            {
                **GEMMA2,
                "attn_logit_softcapping": None,
                "query_pre_attn_scalar": 16,
                "use_bidirectional_attention": True,
            },
            r"use_bidirectional_attention=True",
        ),
        (
            {"model_type": "granite", **SIZES, "attention_multiplier": 0.015625},
            r"granite config has attention_multiplier=0\.015625",
        ),
        ({"model_type": "gpt_oss", **SIZES}, r"GPT-OSS.*sinks"),
        (
            MODERNBERT,
            r"modernbert config has local_attention=128",
        ),
        (
            {"model_type": "qwen3_next", **SIZES, "attn_output_gate": False},
            r"qwen3_next config has attn_output_gate=False",
        ),
        (  # which layers slide is not known without the layer
            {
                "model_type": "qwen2",
                **SIZES,
                "num_hidden_layers": 4,
                "use_sliding_window": True,
                "max_window_layers": 2,
            },
            r"qwen2 config has sliding-window layers.*layer_index=",
        ),
    ],
)
def test_keys_these_layers_do_not_compute_are_refused(config, match):
    # Layer 1: a ModernBERT sliding layer, a Gemma 3 one of its two RoPE types.
    index = 1 if config["model_type"] in ("modernbert", "gemma3_text") else None
    with pytest.raises(ValueError, match=match):
        RotaryGroupQueryAttention.from_transformers_config(config, layer_index=index)


@pytest.mark.parametrize(
    ("config", "index", "expected"),
    [
        (MISTRAL, None, {"sliding_window": 4096, "use_bias": False}),  # MistralConfig's default
        ({**MISTRAL, "sliding_window": None}, None, {"use_bias": False}),
        (
            {**GEMMA2, "attn_logit_softcapping": None, "query_pre_attn_scalar": 16},
            0,
            {"sliding_window": 4096, "use_bias": False},
        ),
        ({**GEMMA2, "attn_logit_softcapping": None, "query_pre_attn_scalar": 16}, 1, {}),
        ({"model_type": "granite", **SIZES, "attention_multiplier": 0.25}, None, {}),
        ({"model_type": "qwen2", **SIZES, "sliding_window": 32}, None, {"use_bias": True}),
        (MODERNBERT, 0, {}),
        ({"model_type": "gpt_neox", **SIZES}, None, {"use_bias": True}),
        ({"model_type": "seed_oss", **SIZES, "attention_dropout": 0.1}, None, {"dropout": 0.1}),
    ],
)
def test_neutral_values_read(config, index, expected):
    arguments = attention_arguments(config, layer_index=index)
    expected = {"use_bias": False, **expected}
    for key in ("sliding_window", "use_gate", "dropout"):
        assert arguments.get(key) == expected.get(key), key
    if config["model_type"] != "seed_oss":
        assert arguments["use_bias"] == expected["use_bias"]


def _read(config, index):
    try:
        arguments = attention_arguments(config, layer_index=index)
    except ValueError as error:
        return str(error)
    return {k: arguments.get(k) for k in ("use_bias", "sliding_window", "use_gate", "dropout")}


# The multimodal configs hold their sizes under text_config; LFM2-MoE's class makes no layer_types.
_NOT_FROM_SIZES = {"qwen2_vl", "qwen2_5_vl", "qwen3_vl", "lfm2_moe"}


@pytest.mark.parametrize("model_type", sorted(set(FAMILIES) - _NOT_FROM_SIZES))
def test_keys_a_config_leaves_out_get_its_config_class_defaults(model_type):
    """A config of sizes only reads as transformers' config class fills it in (its defaults,
    layer types and window transforms: Qwen2's `use_sliding_window`, ...)."""
    raw = {"model_type": model_type, **SIZES, "num_hidden_layers": 2}
    config = transformers.AutoConfig.for_model(**raw)
    if hasattr(config, "layer_types") and "layer_types" not in raw:
        # Families whose RoPE reading needs them (Gemma 3, ModernBERT): both forms have them.
        raw["layer_types"] = list(config.layer_types)
    for index in (0, 1):
        assert _read(raw, index) == _read(config, index) == _read(config.to_dict(), index)
