"""Query/key norms: `from_transformers_config` against transformers' own attention modules.

For each family whose attention normalizes its queries and keys (per head, over all heads,
Gemma's `1 + w`, after RoPE), a tiny random transformers model runs once; a forward hook
takes each decoder layer's attention input and output. `RotaryGroupQueryAttention.
from_transformers_config(config, layer_index=i)`, given the module's weights (the norms'
set away from their initial values, so a missing or wrong scale shows), must give the same
output: without a cache, and prefilling 5 tokens then decoding the other 3 with a cache (a
causal attention's row j is the same whichever way it is computed). The same layer without
its norm differs: the check can fail, as it did before the layers had these norms.
"""

from __future__ import annotations

import numpy as np
import pytest

from keras_posenc import RotaryGroupQueryAttention, _tf

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

LENGTH, PREFILL = 8, 5
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
# Float32 attention of unit-sized inputs with weights of std 0.3: outputs of order 1, summed
# over 64 channels twice; 1e-5 is a few ulps of the largest output, not a fitted number.
ATOL = 1e-5
SLIDING_FULL = ["sliding_attention", "full_attention"]
CASES = {
    "qwen3": {"num_hidden_layers": 1},
    "olmo2": {"num_hidden_layers": 1},
    "olmo3": {"num_hidden_layers": 2, "layer_types": SLIDING_FULL, "sliding_window": 16},
    "gemma3_text": {
        "num_hidden_layers": 2,
        "layer_types": SLIDING_FULL,
        "sliding_window": 16,
        "query_pre_attn_scalar": 16,  # its scale is this ** -0.5: head_dim's, as ours
    },
    # Layer 3 is a global NoPE layer: its queries and keys are normalized all the same.
    "exaone4": {"num_hidden_layers": 4, "sliding_window": 16, "sliding_window_pattern": 4},
    "llama4_text": {  # layer 3 NoPE (no qk_norm there), the others RoPE with the L2 norm
        "num_hidden_layers": 4,
        "intermediate_size_mlp": 64,
        "num_local_experts": 2,
        "num_experts_per_tok": 1,
        "attention_chunk_size": 16,
        "use_qk_norm": True,
        "rms_norm_eps": 1e-3,  # large enough to matter: the epsilon is read, not assumed
    },
    "hunyuan_v1_dense": {"num_hidden_layers": 1},
    "minimax_m2": {
        "num_hidden_layers": 1,
        "rotary_dim": 8,
        "num_local_experts": 2,
        "num_experts_per_tok": 1,
    },
    "apertus": {"num_hidden_layers": 1},
    "lfm2": {"num_hidden_layers": 2, "layer_types": ["conv", "full_attention"]},
    "glm4_moe": {
        "num_hidden_layers": 1,
        "use_qk_norm": True,
        "n_routed_experts": 2,
        "num_experts_per_tok": 1,
        "n_group": 1,
        "topk_group": 1,
        "moe_intermediate_size": 32,
    },
}
# Layers whose transformers attention has no q/k norm: Llama 4's NoPE layers.
WITHOUT_NORM = {("llama4_text", 3)}
_NORMS = {
    "query": ("q_norm", "q_layernorm", "query_layernorm"),
    "key": ("k_norm", "k_layernorm", "key_layernorm"),
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
        attention = getattr(layer, "self_attn", None)
        if attention is None:  # LFM2's convolution layers
            continue
        with torch.no_grad():
            for name, weight in attention.named_parameters():
                if "norm" in name:  # away from 1 (or 0): a missing scale shows
                    weight.copy_(torch.rand(weight.shape, generator=generator) + 0.5)
                else:
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
    """Gives `layer` (built on `x`) the weights of transformers' attention `module`."""
    layer(x[:, :1], x[:, :1])
    heads, kv_heads, head_dim = layer.num_query_heads, layer.num_key_value_heads, layer.head_dim
    width = x.shape[-1]

    def linear(name):
        return getattr(module, name).weight.detach().numpy().T

    for part, name, count in (
        ("query_dense", "q_proj", heads),
        ("key_dense", "k_proj", kv_heads),
        ("value_dense", "v_proj", kv_heads),
    ):
        _tf.attention_part(layer, part).kernel.assign(linear(name).reshape(width, count, head_dim))
    output = "o_proj" if hasattr(module, "o_proj") else "out_proj"
    _tf.attention_part(layer, "output_dense").kernel.assign(
        linear(output).reshape(heads, head_dim, width)
    )
    for role, names in _NORMS.items():
        norm = getattr(layer, f"{role}_norm", None)
        source = next((getattr(module, n) for n in names if hasattr(module, n)), None)
        if norm is not None and norm.scale is not None:
            weight = source.weight.detach().numpy()
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


def test_attention_with_query_key_norms_equals_transformers(side):
    raw, seen = side
    assert seen, "the model ran no attention"
    for index, (module, x, expected) in seen.items():
        layer = RotaryGroupQueryAttention.from_transformers_config(
            raw, layer_index=index, use_bias=False
        )
        has_norm = (raw["model_type"], index) not in WITHOUT_NORM
        assert (layer.query_key_norm is not None) == has_norm, (raw["model_type"], index)
        _copied(layer, module, x)
        output = np.asarray(layer(x, x, use_causal_mask=True))
        np.testing.assert_allclose(output, expected, rtol=0, atol=ATOL, err_msg=str(index))
        np.testing.assert_allclose(_cached(layer, x), expected, rtol=0, atol=ATOL)


def test_without_its_norms_the_attention_differs(side):
    """What `from_transformers_config` built before these layers had q/k norms."""
    raw, seen = side
    for index, (module, x, expected) in seen.items():
        if (raw["model_type"], index) in WITHOUT_NORM:
            continue
        layer = RotaryGroupQueryAttention.from_transformers_config(
            raw, layer_index=index, use_bias=False, query_key_norm=None
        )
        _copied(layer, module, x)
        difference = np.abs(np.asarray(layer(x, x, use_causal_mask=True)) - expected).max()
        assert difference > 1e-3, (raw["model_type"], index, difference)
