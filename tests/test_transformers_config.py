"""Reading transformers configs: raw config.json dicts in the published formats of each family.

The dicts restate the RoPE-relevant keys of the checkpoints' published config.json files
(transformers 4 era, as on the Hub); the expected arguments are read off those files by
hand. Parity with transformers' own code is in `test_transformers_parity.py`.
"""

import doctest
import math
import tracemalloc

import numpy as np
import pytest
from float32_error import assert_within_bound, rotation_error

from keras_posenc import (
    RotaryEmbedding,
    RotaryGroupQueryAttention,
    RotaryMultiHeadAttention,
)
from keras_posenc.configs import arguments as arguments_module
from keras_posenc.configs.arguments import attention_arguments, rotary_arguments
from keras_posenc.configs.families import FAMILIES
from keras_posenc.configs.family import Family

LONG_48 = [1.0 + 0.25 * k for k in range(48)]
SHORT_48 = [1.0 + 0.01 * k for k in range(48)]

LLAMA2_LINEAR = {  # Llama-2-7B with linear position interpolation (a 32k fine-tune)
    "model_type": "llama",
    "hidden_size": 4096,
    "num_attention_heads": 32,
    "num_key_value_heads": 32,
    "max_position_embeddings": 4096,
    "rope_scaling": {"factor": 8.0, "type": "linear"},
    "rope_theta": 10000.0,
}
LLAMA2_DYNAMIC = {**LLAMA2_LINEAR, "rope_scaling": {"factor": 2.0, "type": "dynamic"}}
LLAMA31 = {  # Meta-Llama-3.1-8B
    "model_type": "llama",
    "hidden_size": 4096,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "max_position_embeddings": 131072,
    "rope_scaling": {
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
        "rope_type": "llama3",
    },
    "rope_theta": 500000.0,
}
QWEN25_YARN = {  # Qwen2.5-7B-Instruct with the YaRN block its model card adds
    "model_type": "qwen2",
    "hidden_size": 3584,
    "num_attention_heads": 28,
    "num_key_value_heads": 4,
    "max_position_embeddings": 32768,
    "rope_theta": 1000000.0,
    "rope_scaling": {"factor": 4.0, "original_max_position_embeddings": 32768, "type": "yarn"},
    "sliding_window": 131072,
    "use_sliding_window": False,
}
PHI3_128K = {  # Phi-3-mini-128k-instruct
    "model_type": "phi3",
    "hidden_size": 3072,
    "num_attention_heads": 32,
    "num_key_value_heads": 32,
    "max_position_embeddings": 131072,
    "original_max_position_embeddings": 4096,
    "rope_scaling": {"long_factor": LONG_48, "short_factor": SHORT_48, "type": "longrope"},
    "rope_theta": 10000.0,
}
PHI4_MINI = {  # Phi-4-mini-instruct: a quarter of each head passes through
    **PHI3_128K,
    "num_attention_heads": 24,
    "num_key_value_heads": 8,
    "partial_rotary_factor": 0.75,
}
DEEPSEEK_V3 = {
    "model_type": "deepseek_v3",
    "hidden_size": 7168,
    "num_attention_heads": 128,
    "num_key_value_heads": 128,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "kv_lora_rank": 512,
    "q_lora_rank": 1536,
    "max_position_embeddings": 163840,
    "rope_scaling": {
        "beta_fast": 32,
        "beta_slow": 1,
        "factor": 40,
        "mscale": 1.0,
        "mscale_all_dim": 1.0,
        "original_max_position_embeddings": 4096,
        "type": "yarn",
    },
    "rope_theta": 10000,
}
QWEN2_VL = {"model_type": "qwen2_vl", "hidden_size": 3584, "num_attention_heads": 28}
GPTJ = {"model_type": "gptj", "n_embd": 4096, "n_head": 16, "rotary_dim": 64, "n_positions": 2048}
PYTHIA = {  # pythia-160m
    "model_type": "gpt_neox",
    "hidden_size": 768,
    "num_attention_heads": 12,
    "max_position_embeddings": 2048,
    "rotary_emb_base": 10000,
    "rotary_pct": 0.25,
}
GEMMA3 = {  # gemma-3-4b-it: the language model under text_config
    "model_type": "gemma3",
    "text_config": {
        "model_type": "gemma3_text",
        "hidden_size": 2560,
        "head_dim": 256,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "rope_local_base_freq": 10000.0,
        "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
        "rope_theta": 1000000.0,
        "sliding_window": 1024,
        "max_position_embeddings": 131072,
    },
}
MODERNBERT = {  # ModernBERT-base
    "model_type": "modernbert",
    "hidden_size": 768,
    "num_attention_heads": 12,
    "global_rope_theta": 160000.0,
    "local_rope_theta": 10000.0,
    "global_attn_every_n_layers": 3,
    "local_attention": 128,
    "max_position_embeddings": 8192,
}
MISTRAL = {  # Mistral-7B-v0.1
    "model_type": "mistral",
    "hidden_size": 4096,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "max_position_embeddings": 32768,
    "rope_theta": 10000.0,
    "sliding_window": 4096,
}
MISTRAL_NEMO = {  # head_dim 128, not hidden_size / heads = 160
    **MISTRAL,
    "hidden_size": 5120,
    "head_dim": 128,
    "max_position_embeddings": 1024000,
    "rope_theta": 1000000.0,
    "sliding_window": None,
}
PHI2 = {
    "model_type": "phi",
    "hidden_size": 2560,
    "num_attention_heads": 32,
    "partial_rotary_factor": 0.4,
    "rope_theta": 10000.0,
    "max_position_embeddings": 2048,
}


def arguments(theta, layout="half", rotary_dim=None, scaling=None):
    return {
        "max_wavelength": theta,
        "layout": layout,
        "rotary_dim": rotary_dim,
        "scaling": scaling,
    }


PUBLISHED = {
    "llama2-linear": (
        LLAMA2_LINEAR,
        None,
        arguments(1e4, scaling={"rope_type": "linear", "factor": 8.0}),
    ),
    "llama2-dynamic": (
        LLAMA2_DYNAMIC,
        None,
        arguments(
            1e4,
            scaling={"rope_type": "dynamic", "factor": 2.0, "max_position_embeddings": 4096},
        ),
    ),
    "llama3.1": (
        LLAMA31,
        None,
        arguments(5e5, scaling={**LLAMA31["rope_scaling"]}),
    ),
    "qwen2.5-yarn": (
        QWEN25_YARN,
        None,
        arguments(
            1e6,
            scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768},
        ),
    ),
    "phi3-128k": (
        PHI3_128K,
        None,
        arguments(
            1e4,
            scaling={
                "rope_type": "longrope",
                "long_factor": LONG_48,
                "short_factor": SHORT_48,
                "original_max_position_embeddings": 4096,
                "max_position_embeddings": 131072,
            },
        ),
    ),
    "phi4-mini": (
        PHI4_MINI,
        None,
        arguments(
            1e4,
            rotary_dim=96,
            scaling={
                "rope_type": "longrope",
                "long_factor": LONG_48,
                "short_factor": SHORT_48,
                "original_max_position_embeddings": 4096,
                "max_position_embeddings": 131072,
            },
        ),
    ),
    "deepseek-v3": (
        DEEPSEEK_V3,
        None,
        arguments(
            1e4,
            layout="interleaved",
            scaling={
                "rope_type": "yarn",
                "beta_fast": 32.0,
                "beta_slow": 1.0,
                "factor": 40.0,
                "mscale": 1.0,
                "mscale_all_dim": 1.0,
                "original_max_position_embeddings": 4096,
            },
        ),
    ),
    "gpt-j": (GPTJ, None, arguments(1e4, layout="interleaved", rotary_dim=64)),
    "pythia": (PYTHIA, None, arguments(1e4, rotary_dim=16)),
    "gpt-neox-1e6": ({**PYTHIA, "rotary_emb_base": 1000000}, None, arguments(1e6, rotary_dim=16)),
    "gemma3-global": (
        GEMMA3,
        "full_attention",
        arguments(1e6, scaling={"rope_type": "linear", "factor": 8.0}),
    ),
    "gemma3-local": (GEMMA3, "sliding_attention", arguments(1e4)),
    "modernbert-global": (MODERNBERT, "full_attention", arguments(160000.0)),
    "modernbert-local": (MODERNBERT, "sliding_attention", arguments(1e4)),
    "mistral": (MISTRAL, None, arguments(1e4)),
    "mistral-nemo": (MISTRAL_NEMO, None, arguments(1e6)),
    "phi-2": (PHI2, None, arguments(1e4, rotary_dim=32)),
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_published_configs_are_read_right(name):
    config, layer_type, expected = PUBLISHED[name]
    assert rotary_arguments(config, layer_type) == expected
    layer = RotaryEmbedding.from_transformers_config(config, layer_type=layer_type, name="rope")
    for key, value in expected.items():
        assert getattr(layer, key if key != "scaling" else "scaling") == value, key


def test_the_layer_from_a_config_rotates_as_the_definition():
    """Phi-4-mini's layer: 96 of 128 channels, longrope's long factors past 4096."""
    layer = RotaryEmbedding.from_transformers_config(PHI4_MINI)
    x = np.random.default_rng(0).uniform(-1, 1, (1, 3, 2, 128)).astype(np.float32)
    y = layer(x, start_index=5000).numpy()
    np.testing.assert_array_equal(y[..., 96:], x[..., 96:])
    omega = np.array([1e4 ** (-2 * k / 96) for k in range(48)]) / np.array(LONG_48)
    factor = math.sqrt(1 + math.log(131072 / 4096) / math.log(4096))
    angles = np.arange(5000, 5003)[:, None] * omega
    cos, sin = factor * np.cos(angles)[None, :, None], factor * np.sin(angles)[None, :, None]
    a, b = x[..., :48].astype(np.float64), x[..., 48:96].astype(np.float64)
    want = np.concatenate([a * cos - b * sin, b * cos + a * sin], -1)
    assert_within_bound(y[..., :96], want, rotation_error(x[..., :96], factor=factor))


def test_transformers5_to_dict_form_gives_the_same_layer():
    # transformers 5 writes rope_parameters, keeping the legacy "type" next to "rope_type".
    to_dict = {
        "model_type": "llama",
        "hidden_size": 4096,
        "num_attention_heads": 32,
        "max_position_embeddings": 131072,
        "rope_parameters": {
            **LLAMA31["rope_scaling"],
            "type": "llama3",
            "rope_theta": 500000.0,
        },
    }
    assert rotary_arguments(to_dict) == rotary_arguments(LLAMA31)
    nested = {  # Gemma 3 in transformers 5: rope_parameters keyed by layer type
        **GEMMA3["text_config"],
        "rope_parameters": {
            "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
            "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
        },
    }
    for key in ("rope_theta", "rope_local_base_freq", "rope_scaling"):
        del nested[key]
    for layer_type in ("full_attention", "sliding_attention"):
        assert rotary_arguments(nested, layer_type) == rotary_arguments(GEMMA3, layer_type)


def test_one_layer_type_needs_no_choice_and_a_wrong_one_is_refused():
    qwen = {**QWEN25_YARN, "layer_types": ["full_attention"] * 4}
    assert rotary_arguments(qwen, "full_attention") == rotary_arguments(qwen)
    with pytest.raises(ValueError, match="its types: full_attention"):
        rotary_arguments(qwen, "sliding_attention")
    with pytest.raises(ValueError, match="its types: none"):
        rotary_arguments(LLAMA31, "full_attention")


@pytest.mark.parametrize(
    "config, message",
    [
        (GEMMA3, "full_attention, sliding_attention\\): pass layer_type="),
        (MODERNBERT, "pass layer_type="),
        ({**LLAMA31, "rope_theta": 0}, "rope_theta"),
        ({**LLAMA31, "rope_theta": -1.0}, "rope_theta"),
        ({**LLAMA31, "rope_theta": float("inf")}, "rope_theta"),
        ({**MISTRAL, "head_dim": 0}, "head_dim"),
        ({**MISTRAL, "head_dim": 12.5}, "head_dim"),
        ({**LLAMA31, "num_attention_heads": 0}, "num_attention_heads"),
        ({**LLAMA31, "hidden_size": 4095}, "not a multiple"),
        ({"model_type": "llama", "rope_theta": 1e4}, "needs 'head_dim'"),
        ({**LLAMA31, "model_type": "bloom"}, "'bloom' is not a family"),
        ({k: v for k, v in LLAMA31.items() if k != "model_type"}, "model_type"),
        ({**LLAMA31, "rope_local_base_freq": 1e4}, "rope_local_base_freq"),
        ({**PYTHIA, "rope_theta": 1e6}, "rope_theta"),  # GPT-NeoX reads rotary_emb_base
        ({**MODERNBERT, "rope_theta": 1e6}, "rope_theta"),
        ({**GPTJ, "rope_scaling": {"type": "linear", "factor": 2.0}}, "rope_scaling"),
        ({**LLAMA31, "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]}}, "mrope"),
        (
            {**LLAMA31, "rope_scaling": {**LLAMA31["rope_scaling"], "type": "linear"}},
            "must agree",
        ),
        ({**LLAMA2_LINEAR, "rope_scaling": {"type": "linear", "factor": 2.0, "x": 1}}, "'x'"),
        (
            {**LLAMA2_LINEAR, "rope_parameters": {"rope_type": "linear", "factor": 4.0}},
            "both 'rope_parameters' and 'rope_scaling'",
        ),
        ({**PYTHIA, "rotary_pct": 0.3}, "even number"),  # 19.2 -> 19 channels
        ({**PYTHIA, "rotary_pct": 1.5}, "partial_rotary_factor"),
        ({**PHI3_128K, "rope_scaling": {**PHI3_128K["rope_scaling"], "long_factor": [1.0]}}, "48"),
        ({**LLAMA2_DYNAMIC, "max_position_embeddings": 4096.5}, "max_position_embeddings"),
        ({**DEEPSEEK_V3, "rope_interleave": "yes"}, "rope_interleave"),
        (
            {**PHI3_128K, "rope_scaling": {**PHI3_128K["rope_scaling"], "type": "su"}},
            "'su' needs 'original_max_position_embeddings' inside",
        ),
        (
            {**QWEN2_VL, "rope_scaling": {"type": "mrope", "mrope_section": 64}},
            r"mrope_section.*list.*\[16, 24, 24\]",
        ),
        (
            {**QWEN2_VL, "rope_scaling": {"type": "mrope", "mrope_section": [16, "24", 24]}},
            "mrope_section.*non-negative integers",
        ),
        ({**LLAMA31, "partial_rotary_factor": 0.5}, "partial_rotary_factor.*remove it"),
        (
            {**PYTHIA, "partial_rotary_factor": 0.5},
            "reads 'rotary_pct', not 'partial_rotary_factor'",
        ),
    ],
)
def test_configs_it_does_not_understand_are_errors_naming_the_key(config, message):
    with pytest.raises(ValueError, match=message) as error:
        RotaryEmbedding.from_transformers_config(config)
    assert len(str(error.value)) < 400


def test_config_of_the_wrong_type_and_layout_overrides():
    with pytest.raises(TypeError, match="config must be a dict"):
        rotary_arguments("config.json")
    with pytest.raises(ValueError, match="differs from gptj's own pairing"):
        RotaryEmbedding.from_transformers_config(GPTJ, layout="half")
    # A family the reader does not know, read as Llama-style with the layout the user names.
    unknown = {**LLAMA31, "model_type": "my_llama"}
    layer = RotaryEmbedding.from_transformers_config(unknown, layout="interleaved")
    assert layer.layout == "interleaved" and layer.max_wavelength == 5e5
    assert RotaryEmbedding.from_transformers_config(LLAMA31, name="q_rope").name == "q_rope"


def test_every_family_has_a_bias_rule_and_an_unknown_family_is_named():
    # The bias rule is the one field of a family's record without a default.
    with pytest.raises(TypeError, match="'bias'"):
        Family(layout="half")
    assert all(isinstance(family.bias, (bool, dict)) for family in FAMILIES.values())
    unknown = {**LLAMA31, "model_type": "my_llama"}
    for read in (rotary_arguments, attention_arguments):
        with pytest.raises(ValueError, match="'my_llama' is not a family.*families.FAMILIES"):
            read(unknown)


def test_deepseek_without_interleave_is_half():
    assert rotary_arguments({**DEEPSEEK_V3, "rope_interleave": False})["layout"] == "half"


def test_attention_arguments():
    assert attention_arguments(LLAMA31) == {
        "num_query_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "rope_max_wavelength": 500000.0,
        "rope_layout": "half",
        "rope_dim": None,
        "rope_scaling": LLAMA31["rope_scaling"],
        "use_bias": False,  # attention_bias (false by default)
    }
    assert attention_arguments(GEMMA3, "sliding_attention")["num_key_value_heads"] == 4
    mha = attention_arguments(GPTJ, form="mha")
    assert mha == {
        "num_heads": 16,
        "key_dim": 256,
        "rope_max_wavelength": 1e4,
        "rope_layout": "interleaved",
        "rope_dim": 64,
        "rope_scaling": None,
        "use_bias": False,  # GPT-J's projections have none
    }
    layer = RotaryMultiHeadAttention(**attention_arguments(PYTHIA, form="mha"))
    rope = layer.rotary_embedding
    assert (rope.rotary_dim, rope.layout, layer.num_heads, layer.key_dim) == (16, "half", 12, 64)
    with pytest.raises(ValueError, match="RotaryGroupQueryAttention"):
        attention_arguments(LLAMA31, form="mha")
    # The layers' own readers take the same arguments.
    gqa = RotaryGroupQueryAttention.from_transformers_config(LLAMA31, name="attention")
    assert (gqa.num_query_heads, gqa.num_key_value_heads, gqa.head_dim) == (32, 8, 128)
    assert gqa.rotary_embedding.scaling["rope_type"] == "llama3"
    assert RotaryMultiHeadAttention.from_transformers_config(GPTJ).num_heads == 16
    # Multimodal RoPE is read into the layers (tests/test_rotary_attention_axes.py).
    qwen2_vl = {
        "model_type": "qwen2_vl",
        "hidden_size": 64,
        "num_attention_heads": 4,
        "rope_scaling": {"rope_type": "default", "mrope_section": [4, 2, 2]},
    }
    assert attention_arguments(qwen2_vl)["rope_mrope_section"] == (4, 2, 2)
    with pytest.raises(ValueError, match="multi-head latent attention"):
        attention_arguments(DEEPSEEK_V3)
    with pytest.raises(ValueError, match="form must be"):
        attention_arguments(LLAMA31, form="gpa")


def test_docstring_examples_run():
    results = doctest.testmod(arguments_module, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert results.attempted > 0 and results.failed == 0


def test_a_crafted_head_size_allocates_nothing_before_build():
    crafted = {**PHI2, "head_dim": 10**9, "partial_rotary_factor": 0.5}
    tracemalloc.start()
    layer = RotaryEmbedding.from_transformers_config(crafted)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert layer.rotary_dim == 5 * 10**8 and peak < 2**20, peak


def test_a_partial_rotary_factor_the_family_ignores_leaves_the_whole_head():
    # transformers' Llama attention rotates every channel; its default frequencies ignore it.
    assert rotary_arguments({**MISTRAL, "partial_rotary_factor": 0.5}) == arguments(1e4)
    assert rotary_arguments({**GPTJ, "partial_rotary_factor": 0.5})["rotary_dim"] == 64


TINY = {
    "vocab_size": 64,
    "hidden_size": 64,
    "intermediate_size": 32,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "num_hidden_layers": 1,
    "head_dim": 16,
    "pad_token_id": 0,
}


@pytest.mark.parametrize(
    "model_type, section",
    [("qwen2_vl", [2, 3]), ("qwen2_vl", [3, 3, 3]), ("qwen3_vl_text", [2, 3])],
)
def test_an_mrope_section_that_does_not_fill_the_head_is_refused_when_read(model_type, section):
    # A 16-channel head has 8 pairs. transformers fails in its split_with_sizes (Qwen2-VL)
    # or its interleaving's indexing (Qwen3-VL, [2, 3]); it runs Qwen3-VL's [3, 3, 3] by
    # cutting the last axis short, which is no section of 8 pairs either.
    raw = {
        **TINY,
        "model_type": model_type,
        "rope_scaling": {"type": "mrope", "mrope_section": section},
    }
    counted = sum(section)
    with pytest.raises(
        ValueError,
        match=rf"mrope_section .* counts {counted} channel pairs.*"
        r"16 channels \(8 pairs\).*sums to 8",
    ):
        rotary_arguments(raw)


def _transformers_rotated_channels(raw: dict) -> int | None:
    """The channels transformers' model rotates for `raw`, None where it refuses the config."""
    import transformers

    try:
        model = transformers.AutoModel.from_config(transformers.AutoConfig.for_model(**raw))
    except Exception as error:  # phi, stablelm: a KeyError when built; phi3: its validation
        assert "partial_rotary_factor" in str(error) or "NoneType" in str(error), error
        return None
    (rotary,) = (m for m in model.modules() if type(m).__name__.endswith("RotaryEmbedding"))
    return 2 * rotary.inv_freq.shape[-1]


@pytest.mark.parametrize(
    "model_type, extra",
    [
        ("phi", {}),
        ("stablelm", {}),
        ("phi3", {}),
        ("glm4_moe", {}),
        ("qwen3_next", {"layer_types": ["full_attention"]}),
        ("minimax_m2", {"rotary_dim": 8}),
    ],
)
def test_a_null_partial_rotary_factor_is_refused_never_read_as_the_default(model_type, extra):
    raw = {**TINY, "model_type": model_type, **extra}
    default = rotary_arguments(raw)["rotary_dim"] or raw["head_dim"]
    null = {**raw, "partial_rotary_factor": None}
    # transformers refuses it, or rotates another part of the head than its default.
    assert _transformers_rotated_channels(null) != default
    with pytest.raises(ValueError, match=r"partial_rotary_factor.*null.*remove the key"):
        rotary_arguments(null)


def test_a_null_partial_rotary_factor_where_transformers_ignores_it_is_ignored():
    # gpt_neox reads rotary_pct; a whole-head family never reads the factor.
    for model_type in ("gpt_neox", "llama"):
        raw = {**TINY, "model_type": model_type}
        null = {**raw, "partial_rotary_factor": None}
        assert rotary_arguments(null) == rotary_arguments(raw)
        assert _transformers_rotated_channels(null) == (rotary_arguments(raw)["rotary_dim"] or 16)
