"""`attention_temperature` against transformers' Llama 4 attention, positions 0..20000.

The scale is captured from a NoPE layer of a tiny `Llama4TextAttention`: its queries going into
the attention function divided by the same queries without the scale (the layer's own
`q_proj`), at every position of one long prefill and of a decoding step after a cache.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
import torch
import transformers
from float32_error import U
from transformers.models.llama4 import modeling_llama4

from keras_posenc import AttentionTemperature, attention_temperature, rope_per_layer

LAST = 20000
SIZES = {
    "vocab_size": 64,
    "hidden_size": 32,
    "intermediate_size": 32,
    "intermediate_size_mlp": 32,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 16,
    "num_hidden_layers": 4,
    "num_local_experts": 2,
    "num_experts_per_tok": 1,
}


class _Cache:
    """Just what Llama4TextAttention asks of a cache: its length, and an update."""

    def __init__(self, length):
        self.length = length

    def get_seq_length(self, layer_idx):
        return self.length

    def update(self, key, value, layer_idx, **kwargs):
        return key, value


def _transformers_scales(config, length, past):
    attention = modeling_llama4.Llama4TextAttention(config, layer_idx=3).eval()  # NoPE layer
    assert not attention.use_rope
    captured = []

    def capture(module, query, *args, **kwargs):
        captured.append(query)
        return torch.zeros(1, length, 2, 16), None

    hidden = torch.randn(1, length, 32, generator=torch.Generator().manual_seed(0))
    original = modeling_llama4.eager_attention_forward
    modeling_llama4.eager_attention_forward = capture
    try:
        with torch.no_grad():
            attention(hidden, None, None, cache=_Cache(past))
            unscaled = attention.q_proj(hidden).view(1, length, 2, 16).transpose(1, 2)
    finally:
        modeling_llama4.eager_attention_forward = original
    ratio = (captured[0].double() / unscaled.double()).numpy()  # (1, heads, length, 16)
    return np.median(ratio, axis=(0, 1, 3))


@pytest.mark.parametrize("config_keys", [{}, {"floor_scale": 1000, "attn_scale": 0.25}])
def test_attention_temperature_equals_transformers_at_positions_0_to_20000(config_keys):
    raw = {"model_type": "llama4_text", **SIZES, **config_keys}
    config = transformers.AutoConfig.for_model(**raw)
    temperature = attention_temperature(raw)
    prefill = _transformers_scales(config, LAST + 1, past=0)
    ours = temperature(np.arange(LAST + 1)).numpy()
    # `log1p(floor(...)) · attn_scale + 1` in float32 on each side: log1p within 2 ulp of a
    # value below the sum, a product and a sum rounded (4 u of the factor), and transformers'
    # query times it rounded once more (the ratio of two float32 queries): 4 u + 5 u.
    rtol = 9 * U
    np.testing.assert_allclose(ours, prefill, rtol=rtol)
    assert len(np.unique(ours)) >= 3  # the scale steps within the range
    # A decoding step after a cache of LAST tokens: position LAST, from the cache's length.
    step = _transformers_scales(config, 1, past=LAST)
    np.testing.assert_allclose(temperature(np.array([LAST])).numpy(), step, rtol=rtol)


def test_attention_temperature_is_for_the_nope_layers_of_llama4():
    raw = {"model_type": "llama4", "text_config": {"model_type": "llama4_text", **SIZES}}
    assert [layer is None for layer in rope_per_layer(raw)] == [False, False, False, True]
    assert attention_temperature(raw).floor_scale == 8192
    assert attention_temperature({**raw["text_config"], "attn_temperature_tuning": False}) is None
    with pytest.raises(ValueError, match="no attention temperature"):
        attention_temperature({"model_type": "smollm3"})


def test_attention_temperature_round_trips_and_refuses_bad_values(tmp_path):
    layer = AttentionTemperature(floor_scale=4096, attn_scale=0.2)
    again = AttentionTemperature.from_config(layer.get_config())
    positions = np.array([0, 4095, 4096, 1 << 23])
    np.testing.assert_array_equal(again(positions).numpy(), layer(positions).numpy())
    inputs = keras.Input((None,), dtype="int32")
    model = keras.Model(inputs, layer(inputs))
    model.save(tmp_path / "t.keras")
    loaded = keras.saving.load_model(tmp_path / "t.keras")
    np.testing.assert_array_equal(loaded(positions[None]).numpy()[0], layer(positions).numpy())
    with pytest.raises(ValueError, match="floor_scale must be a positive integer"):
        AttentionTemperature(floor_scale=0)
    with pytest.raises(TypeError, match="positions must be integers"):
        layer(np.array([1.5]))
