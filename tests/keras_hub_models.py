"""Tiny random keras_hub CausalLMs of each family the bridge reads (nothing downloaded).

Backbones are built from configs and their weights redrawn at scales that make the
logits of order 1 and the attention far from uniform (keras_hub's initialisers give
logits of order 1e-3, where a wrong position would hardly move a token): kernels
N(0, 1/fan_in) (the embeddings N(0, 1),
or N(0, 1/width) where the head reads them), norm scales 1 + N(0, 0.2²) (Gemma's
`1 + scale` too), biases N(0, 0.5²).
"""

from __future__ import annotations

import importlib.util

import keras_hub
import numpy as np

VOCABULARY, MAX_LENGTH = 100, 128
# save_decoder's verification runs the folder in og.Model too where onnxruntime-genai is installed.
GENAI = ["onnxruntime-genai"] if importlib.util.find_spec("onnxruntime_genai") else []
COMMON = dict(
    vocabulary_size=VOCABULARY,
    num_layers=2,
    num_query_heads=4,
    hidden_dim=64,
    intermediate_dim=96,
    num_key_value_heads=2,
)
# Family -> (backbone class, CausalLM class, backbone options).
FAMILIES = {
    "llama": ("LlamaBackbone", "LlamaCausalLM", {}),
    "llama3": (
        "Llama3Backbone",
        "Llama3CausalLM",
        # pretraining length 32: the llama3 blend changes frequencies of wavelength 8-32.
        dict(
            rope_frequency_adjustment_factor=8.0,
            rope_low_freq_factor=1.0,
            rope_high_freq_factor=4.0,
            rope_pretraining_sequence_length=32,
        ),
    ),
    # A window of 16 slots: the 72 positions the verification covers pass it.
    "mistral": ("MistralBackbone", "MistralCausalLM", dict(sliding_window=16)),
    "qwen2": ("Qwen2Backbone", "Qwen2CausalLM", dict(rope_scaling_factor=2.0)),
    "qwen3": ("Qwen3Backbone", "Qwen3CausalLM", dict(head_dim=16, tie_word_embeddings=False)),
    # su (longrope) scaling, exact up to its switch at 128: short factors, attention
    # factor sqrt(1 + ln(512 / 128) / ln(128)).
    "phi3": (
        "Phi3Backbone",
        "Phi3CausalLM",
        dict(
            rope_scaling_type="su",
            rope_scaling_short_factor=[1.0, 1.1, 1.3, 1.6, 2.0, 2.5, 3.1, 4.0],
            rope_scaling_long_factor=[1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0],
            max_sequence_length=512,
            pretraining_sequence_length=128,
        ),
    ),
    "gemma": ("GemmaBackbone", "GemmaCausalLM", dict(head_dim=16)),
    # Gemma 2's settings: post norms, soft caps, a window of 16 on every other layer.
    "gemma2": (
        "GemmaBackbone",
        "GemmaCausalLM",
        dict(
            head_dim=32,
            use_post_ffw_norm=True,
            use_post_attention_norm=True,
            attention_logit_soft_cap=3.0,
            final_logit_soft_cap=2.0,
            use_sliding_window_attention=True,
            sliding_window_size=16,
        ),
    ),
    # Six layers: five local (RoPE base 1e4, window 16), one global (base 1e6, scaled by 4).
    "gemma3": (
        "Gemma3Backbone",
        "Gemma3CausalLM",
        dict(
            image_size=16,  # required, unused without a vision encoder
            num_layers=6,
            hidden_dim=32,
            intermediate_dim=64,
            head_dim=16,
            use_post_ffw_norm=True,
            use_post_attention_norm=True,
            use_sliding_window_attention=True,
            sliding_window_size=16,
            global_rope_scaling_factor=4.0,
        ),
    ),
}


def redraw(backbone, seed: int = 0) -> None:
    """The backbone's weights redrawn at the scales of the module docstring."""
    rng = np.random.default_rng(seed)
    gemma = type(backbone).__name__.startswith("Gemma")
    for weight in backbone.weights:
        shape = tuple(weight.shape)
        if weight.path.endswith("scale"):  # Gemma's norms multiply by 1 + scale
            value = (0 if gemma else 1) + 0.2 * rng.standard_normal(shape)
        elif weight.path.endswith("bias"):
            value = 0.5 * rng.standard_normal(shape)
        else:
            if weight.path.endswith("/embeddings"):  # a tied head reads them as a kernel
                fan_in = shape[1] if backbone.token_embedding.tie_weights else 1
            elif "attention_output" in weight.path:
                fan_in = shape[0] * shape[1]
            elif len(shape) == 3:  # q/k/v kernels: (width, heads, head_dim) or Gemma's
                fan_in = backbone.hidden_dim  # (heads, width, head_dim)
            else:
                fan_in = shape[0]
            value = rng.standard_normal(shape) / np.sqrt(fan_in)
        weight.assign(value.astype(np.float32))


def tiny_causal_lm(family: str, seed: int = 0, **options):
    backbone_class, causal_lm_class, defaults = FAMILIES[family]
    backbone = getattr(keras_hub.models, backbone_class)(**{**COMMON, **defaults, **options})
    redraw(backbone, seed)
    return getattr(keras_hub.models, causal_lm_class)(backbone=backbone, preprocessor=None)


# The 2026 families (tests/test_keras_hub_2026.py), kept apart from `FAMILIES` so that the
# tests of every family above do not grow: family -> (backbone, CausalLM, options).
FAMILIES_2026 = {
    # Four layers, the first NoPE (SmolLM3's are every fourth; the first, here, moves the
    # tokens most when rotated), q/k/v biases.
    "smollm3": (
        "SmolLM3Backbone",
        "SmolLM3CausalLM",
        dict(
            vocabulary_size=VOCABULARY,
            hidden_dim=64,
            intermediate_dim=96,
            num_layers=4,
            num_attention_heads=4,
            num_key_value_heads=2,
            attention_bias=True,
            attention_dropout=0.0,
            rope_layer_enabled_list=[False, True, True, True],
            layer_types=["full_attention"] * 4,
            mlp_bias=False,
            layer_norm_epsilon=1e-6,
            max_position_embeddings=MAX_LENGTH,
            rope_theta=10000.0,
            partial_rotary_factor=1.0,
        ),
    ),
    # Four layers, local (base 1e4, window 16) and global alternating; the global ones
    # with proportional RoPE (a quarter of the pairs turn, base 1e6, factor 4) and K = V.
    "gemma4": (
        "Gemma4Backbone",
        "Gemma4CausalLM",
        dict(
            vocabulary_size=VOCABULARY,
            image_size=16,  # required, unused without a vision encoder
            num_layers=4,
            num_query_heads=4,
            num_key_value_heads=2,
            hidden_dim=64,
            intermediate_dim=96,
            head_dim=32,
            final_logit_soft_cap=5.0,
            sliding_window_size=16,
            sliding_window_pattern=2,
            global_rope_scaling_factor=4.0,
            global_rope_partial_rotary_factor=0.25,
            num_global_key_value_heads=2,
        ),
    ),
}


def redraw_2026(backbone, seed: int) -> None:
    """As `redraw`, for the 2026 families: norms multiply by their scale itself, keras_hub's
    non-trainable weights (SmolLM3's inverse frequencies) kept, and Gemma 4's
    `layer_scalar` drawn away from 1 (so that the export must write it)."""
    rng = np.random.default_rng(seed)
    for weight in backbone.weights:
        shape = tuple(weight.shape)
        if weight.path.endswith("layer_scalar"):
            value = rng.uniform(0.5, 1.5, shape)
        elif not weight.trainable:
            continue
        elif weight.path.endswith("scale"):
            value = 1 + 0.2 * rng.standard_normal(shape)
        elif weight.path.endswith("bias"):
            value = 0.5 * rng.standard_normal(shape)
        else:
            if weight.path.endswith("/embeddings"):  # the tied head reads them as a kernel
                fan_in = shape[1]
            elif len(shape) == 3 and "attention_output" not in weight.path:
                fan_in = backbone.hidden_dim  # Gemma 4's (heads, width, head_dim)
            elif len(shape) == 3:
                fan_in = shape[0] * shape[1]
            else:
                fan_in = shape[0]
            value = rng.standard_normal(shape) / np.sqrt(fan_in)
        weight.assign(value.astype(np.float32))


def tiny_causal_lm_2026(family: str, seed: int = 0, **options):
    """A tiny random CausalLM of `FAMILIES_2026` (`options` override the backbone's)."""
    backbone_class, causal_lm_class, defaults = FAMILIES_2026[family]
    backbone = getattr(keras_hub.models, backbone_class)(**{**defaults, **options})
    redraw_2026(backbone, seed)
    return getattr(keras_hub.models, causal_lm_class)(backbone=backbone, preprocessor=None)


# GPT-OSS (not in FAMILIES: its own test file): four experts, two a token, a window of 8
# on the odd layer, YaRN by 32 (keras_hub's original length 4096: the slow channels are
# interpolated), and at the module docstring's scales but for the sinks, N(1, 1) (of the
# order of the scores, so that they take a share of each softmax), and the experts'
# gate/up kernels, 3x (so that the clamp at 7 is reached).
GPT_OSS = dict(num_experts=4, top_k=2, sliding_window=8, rope_scaling_factor=32.0)


def tiny_gpt_oss(seed: int = 0, **options):
    backbone = keras_hub.models.GptOssBackbone(**{**COMMON, **GPT_OSS, **options})
    redraw(backbone, seed)
    rng = np.random.default_rng(seed + 1)
    for layer in backbone.transformer_layers:
        sinks = layer.self_attention_layer.sinks
        sinks.assign((1.0 + rng.standard_normal(tuple(sinks.shape))).astype(np.float32))
        experts = layer.sparse_moe_block.experts
        experts.gate_up_proj.assign(3.0 * experts.gate_up_proj.numpy())
    return keras_hub.models.GptOssCausalLM(backbone=backbone, preprocessor=None)


def assert_greedy_is_generate(causal_lm, steps: int = 20) -> None:
    """`keras_hub_greedy`'s tokens are those of `causal_lm`'s own compiled `generate()`
    (greedy sampler) for left-padded prompts of different lengths in one batch."""
    import keras

    from keras_posenc.export.decoder import decoder_cases
    from keras_posenc.keras_hub import keras_hub_greedy

    causal_lm.compile(sampler="greedy")
    case = decoder_cases(VOCABULARY, MAX_LENGTH)[1]
    prompts, mask = case["prompts"], case["mask"]
    tokens, _ = keras_hub_greedy(causal_lm)(prompts, mask, steps)
    width = prompts.shape[1]
    token_ids = np.zeros((len(prompts), width + steps + 1), np.int32)
    padding = np.zeros_like(token_ids, dtype=bool)
    for row, length in enumerate(mask.sum(axis=1)):
        token_ids[row, :length] = prompts[row, width - length :]
        padding[row, :length] = True
    generate = causal_lm.make_generate_function()
    out = generate({"token_ids": token_ids, "padding_mask": padding}, None)
    generated = keras.ops.convert_to_numpy(out["token_ids"])
    for row, length in enumerate(mask.sum(axis=1)):
        np.testing.assert_array_equal(generated[row, length : length + steps + 1], tokens[row])


def og_greedy_text(causal_lm, folder, prompt: str, max_length: int) -> str:
    """The text onnxruntime-genai generates greedily from `folder` after `prompt`, with
    the start token of `causal_lm`'s preprocessor (og's `encode` adds none, keras_hub's
    preprocessor does)."""
    import onnxruntime_genai as og

    model = og.Model(str(folder))
    og_tokenizer = og.Tokenizer(model)
    params = og.GeneratorParams(model)
    params.set_search_options(do_sample=False, max_length=max_length)
    generator = og.Generator(model, params)
    start = causal_lm.preprocessor.tokenizer.start_token_id
    generator.append_tokens(np.array([[start, *og_tokenizer.encode(prompt)]], np.int32))
    while not generator.is_done():
        generator.generate_next_token()
    return og_tokenizer.decode(generator.get_sequence(0))
