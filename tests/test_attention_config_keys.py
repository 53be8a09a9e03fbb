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

from keras_posenc import RotaryGroupQueryAttention, RotaryMultiHeadAttention, _tf
from keras_posenc.transformers_attention_keys import _BIAS
from keras_posenc.transformers_config import FAMILIES, attention_arguments

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

LENGTH, PREFILL, WINDOW = 8, 5, 3  # the window is shorter than the prefill and the sequence
SIZES = {
    "vocab_size": 64,
    "hidden_size": 64,
    "intermediate_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": 128,
    "pad_token_id": 0,
}
# Float32 attention of unit-sized inputs, weights of std 0.3 (as test_query_key_norm_parity):
# outputs of order 1, summed over 64 channels twice; 1e-5 is a few ulps of the largest.
ATOL = 1e-5
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


def _transformers_side(model_type: str):
    """`(raw config, {layer index: (attention module, input, output)})` of a tiny model."""
    raw = {"model_type": model_type, **SIZES, **CASES[model_type]}
    config = transformers.AutoConfig.for_model(**raw)
    torch.manual_seed(0)
    model = transformers.AutoModel.from_config(config, attn_implementation="eager").eval()
    generator = torch.Generator().manual_seed(1)
    seen, hooks = {}, []
    for index, layer in enumerate(model.layers):
        attention = layer.self_attn
        with torch.no_grad():
            for name, weight in attention.named_parameters():
                if "norm" in name:  # away from 1 (or 0): a missing scale shows
                    weight.copy_(torch.rand(weight.shape, generator=generator) + 0.5)
                else:  # biases too: a dropped bias shows
                    weight.copy_(torch.randn(weight.shape, generator=generator) * 0.3)

        def hook(module, args, kwargs, output, index=index):
            hidden = kwargs.get("hidden_states", args[0] if args else None)
            seen[index] = (module, hidden.detach().numpy(), output[0].detach().numpy())

        hooks.append(attention.register_forward_hook(hook, with_kwargs=True))
    ids = torch.tensor(np.random.default_rng(0).integers(1, 64, (2, LENGTH)))
    with torch.no_grad():
        model(input_ids=ids)
    for hook in hooks:
        hook.remove()
    return raw, seen


def _copied(layer, module, x: np.ndarray) -> None:
    """Gives `layer` (built on `x`) the weights of transformers' attention `module`.

    Qwen3-Next's q_proj holds per head the queries then the gate; a projection without a
    bias in transformers gets a zero one here.
    """
    layer(x[:, :1], x[:, :1])
    heads, kv_heads, head_dim = layer.num_query_heads, layer.num_key_value_heads, layer.head_dim
    width = x.shape[-1]

    def weights(name, count, rows):
        linear = getattr(module, name)
        kernel = linear.weight.detach().numpy().reshape(count, rows, width)
        bias = linear.bias
        bias = np.zeros((count, rows)) if bias is None else bias.detach().numpy()
        return kernel, bias.reshape(count, rows)

    gated = layer._uses_gate()
    query, query_bias = weights("q_proj", heads, head_dim * (2 if gated else 1))
    parts = {
        "query_dense": (query[:, :head_dim], query_bias[:, :head_dim]),
        "key_dense": weights("k_proj", kv_heads, head_dim),
        "value_dense": weights("v_proj", kv_heads, head_dim),
    }
    if gated:
        parts["gate_dense"] = (query[:, head_dim:], query_bias[:, head_dim:])
    for part, (kernel, bias) in parts.items():
        dense = _tf.attention_part(layer, part)
        dense.kernel.assign(kernel.transpose(2, 0, 1))
        if dense.bias is not None:
            dense.bias.assign(bias)
        else:
            assert not bias.any(), part
    output = _tf.attention_part(layer, "output_dense")
    output.kernel.assign(module.o_proj.weight.detach().numpy().T.reshape(heads, head_dim, width))
    if output.bias is not None:
        bias = module.o_proj.bias
        output.bias.assign(np.zeros(width) if bias is None else bias.detach().numpy())
    for role, name in (("query", "q_norm"), ("key", "k_norm")):
        norm = getattr(layer, f"{role}_norm", None)
        if norm is not None and norm.scale is not None:
            weight = getattr(module, name).weight.detach().numpy()
            norm.scale.assign(weight.reshape(tuple(norm.scale.shape)))


def _cached(layer, x: np.ndarray) -> np.ndarray:
    kv_heads, head_dim = layer.num_key_value_heads, layer.head_dim
    cache = np.zeros((x.shape[0], 2, LENGTH, kv_heads, head_dim), np.float32)
    outputs = []
    for start, stop in ((0, PREFILL), *((i, i + 1) for i in range(PREFILL, LENGTH))):
        step = x[:, start:stop]
        output, cache = layer(
            step, step, use_causal_mask=True, cache=cache, cache_update_index=start
        )
        outputs.append(np.asarray(output))
    return np.concatenate(outputs, axis=1)


@pytest.fixture(scope="module", params=sorted(CASES))
def side(request):
    return _transformers_side(request.param)


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
        _copied(layer, module, x)
        output = np.asarray(layer(x, x, use_causal_mask=True))
        np.testing.assert_allclose(output, expected, rtol=0, atol=ATOL, err_msg=str(index))
        np.testing.assert_allclose(_cached(layer, x), expected, rtol=0, atol=ATOL)


def test_without_the_window_the_attention_differs(side):
    """The check can fail: a layer without its window is other attention here."""
    raw, seen = side
    for index, (module, x, expected) in seen.items():
        if "sliding_window" not in READ[raw["model_type"], index]:
            continue
        layer = RotaryGroupQueryAttention.from_transformers_config(
            raw, layer_index=index, sliding_window=None
        )
        _copied(layer, module, x)
        difference = np.abs(np.asarray(layer(x, x, use_causal_mask=True)) - expected).max()
        assert difference > 1e-3, (raw["model_type"], index, difference)


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


def test_every_family_has_a_bias_rule():
    assert set(FAMILIES) <= set(_BIAS)


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
