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
from attention_parity import (
    SIZES,
    assert_other_attention,
    assert_same_attention,
    cached_outputs,
    copy_weights,
    norm_epsilon,
    transformers_side,
)

from keras_posenc import RotaryGroupQueryAttention

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

LENGTH, PREFILL = 8, 5
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


@pytest.fixture(scope="module", params=sorted(CASES))
def side(request):
    raw = {"model_type": request.param, **SIZES, **CASES[request.param]}
    return raw, transformers_side(raw, LENGTH)


def test_attention_with_query_key_norms_equals_transformers(side):
    raw, seen = side
    assert seen, "the model ran no attention"
    for index, (module, x, expected) in seen.items():
        layer = RotaryGroupQueryAttention.from_transformers_config(
            raw, layer_index=index, use_bias=False
        )
        has_norm = (raw["model_type"], index) not in WITHOUT_NORM
        assert (layer.query_key_norm is not None) == has_norm, (raw["model_type"], index)
        # Read, not assumed (a wrong epsilon moves these outputs less than the float32 bound).
        if has_norm:
            epsilon = layer.get_config()["query_key_norm_epsilon"]
            assert epsilon == norm_epsilon(module), (raw["model_type"], index)
        copy_weights(layer, module, x)
        output = np.asarray(layer(x, x, use_causal_mask=True))
        assert_same_attention(output, module, x, expected)
        assert_same_attention(cached_outputs(layer, x, PREFILL), module, x)


def test_without_its_norms_the_attention_differs(side):
    """What `from_transformers_config` built before these layers had q/k norms."""
    raw, seen = side
    for index, (module, x, _) in seen.items():
        if (raw["model_type"], index) in WITHOUT_NORM:
            continue
        layer = RotaryGroupQueryAttention.from_transformers_config(
            raw, layer_index=index, use_bias=False, query_key_norm=None
        )
        copy_weights(layer, module, x)
        assert_other_attention(layer(x, x, use_causal_mask=True), module, x)
