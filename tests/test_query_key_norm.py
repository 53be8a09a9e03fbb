"""The rotary attention layers' `query_key_norm`: each kind against a numpy float64 formula,
its weights through `.keras` files, and what `from_transformers_config` reads or refuses.

The layers' outputs with q/k norms are checked against transformers' own attention modules
in tests/test_query_key_norm_parity.py; here each kind's norm alone (NoPE layers, so RoPE
plays no part) against `x / sqrt(mean(x²) + eps) * scale` in float64.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest

from keras_posenc import RotaryGroupQueryAttention, RotaryMultiHeadAttention
from keras_posenc.configs.arguments import attention_arguments
from keras_posenc.layers.query_key_norm import QUERY_KEY_NORMS

WIDTH, HEADS, KV_HEADS, HEAD_DIM = 12, 4, 2, 6
_RNG = np.random.default_rng(0)


def _reference(x: np.ndarray, kind: str, scale, epsilon: float) -> np.ndarray:
    """The norm of `(batch, sequence, heads, head_dim)` heads, in float64."""
    x = x.astype(np.float64)
    axes = (-2, -1) if kind == "rms_across_heads" else (-1,)
    normed = x / np.sqrt(np.mean(x**2, axis=axes, keepdims=True) + epsilon)
    if kind == "l2_after_rope":
        return normed
    scale = np.asarray(scale, np.float64)
    return normed * (1.0 + scale if kind == "gemma_rms_per_head" else scale)


def _scaled(layer) -> None:
    """Scales away from their initial values, so a scale left out or misread shows."""
    for norm in (layer.query_norm, layer.key_norm):
        if norm.scale is not None:
            norm.scale.assign(_RNG.uniform(0.5, 1.5, tuple(norm.scale.shape)))


def _heads(layer, x: np.ndarray):
    """The layer's projected queries and keys, `(batch, sequence, heads, head_dim)`."""
    from keras_posenc.backend import tensorflow as tf_backend

    return (
        np.asarray(tf_backend.attention_part(layer, "query_dense")(x)),
        np.asarray(tf_backend.attention_part(layer, "key_dense")(x)),
    )


@pytest.mark.parametrize("kind", sorted(QUERY_KEY_NORMS))
def test_each_kind_normalizes_queries_and_keys_as_its_formula(kind):
    epsilon = 0.05  # large: an epsilon left out or misplaced changes the outputs
    layer = RotaryGroupQueryAttention(
        HEAD_DIM,
        HEADS,
        KV_HEADS,
        rope_dim=0,
        query_key_norm=kind,
        query_key_norm_epsilon=epsilon,
    )
    x = _RNG.normal(size=(2, 5, WIDTH)).astype(np.float32) * 0.3  # small: epsilon matters
    layer(x, x)
    _scaled(layer)
    queries, keys = _heads(layer, x)
    for norm, heads in ((layer.query_norm, queries), (layer.key_norm, keys)):
        scale = None if norm.scale is None else np.asarray(norm.scale)
        expected = _reference(heads, kind, scale, epsilon)
        # float32 rounding of a few products and one rsqrt on values of order 1.
        np.testing.assert_allclose(np.asarray(norm(heads)), expected, rtol=0, atol=2e-6)
    # The attention itself sees them: another epsilon gives another output.
    other = RotaryGroupQueryAttention(
        HEAD_DIM, HEADS, KV_HEADS, rope_dim=0, query_key_norm=kind, query_key_norm_epsilon=1e-6
    )
    other(x, x)
    other.set_weights(layer.get_weights())
    assert np.abs(np.asarray(other(x, x)) - np.asarray(layer(x, x))).max() > 1e-4


@pytest.mark.parametrize("kind", ["rms_per_head", "rms_across_heads", "rms_per_head_after_rope"])
def test_keras_file_keeps_the_norms_scales(kind, tmp_path):
    for make in (
        lambda: RotaryGroupQueryAttention(HEAD_DIM, HEADS, KV_HEADS, query_key_norm=kind),
        lambda: RotaryMultiHeadAttention(num_heads=HEADS, key_dim=HEAD_DIM, query_key_norm=kind),
    ):
        inputs = keras.Input((None, WIDTH))
        layer = make()
        model = keras.Model(inputs, layer(inputs, inputs, use_causal_mask=True))
        _scaled(layer)
        model.save(tmp_path / "model.keras")
        loaded = keras.models.load_model(tmp_path / "model.keras")
        restored = loaded.get_layer(layer.name)
        assert restored.get_config()["query_key_norm"] == kind
        for ours, theirs in (
            (layer.query_norm, restored.query_norm),
            (layer.key_norm, restored.key_norm),
        ):
            np.testing.assert_array_equal(np.asarray(theirs.scale), np.asarray(ours.scale))
        x = _RNG.normal(size=(2, 5, WIDTH)).astype(np.float32)
        np.testing.assert_array_equal(loaded(x), model(x))


@pytest.mark.parametrize(
    "arguments, message",
    [
        ({"query_key_norm": "rms"}, "query_key_norm='rms' is not a query/key norm"),
        ({"query_key_norm": "rms_per_head", "query_key_norm_epsilon": 0.0}, "positive number"),
        ({"query_key_norm": "rms_per_head", "query_key_norm_epsilon": "1e-6"}, "positive"),
    ],
)
def test_bad_settings_are_refused(arguments, message):
    with pytest.raises(ValueError, match=message):
        RotaryGroupQueryAttention(HEAD_DIM, HEADS, KV_HEADS, **arguments)
    with pytest.raises(ValueError, match=message):
        RotaryMultiHeadAttention(num_heads=HEADS, key_dim=HEAD_DIM, **arguments)


SIZES = {
    "hidden_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "num_hidden_layers": 1,
}
GEMMA, FULL = "gemma_rms_per_head", ["full_attention"]


@pytest.mark.parametrize(
    "config, expected",
    [
        ({"model_type": "qwen3"}, ("rms_per_head", 1e-6)),
        ({"model_type": "qwen3", "rms_norm_eps": 1e-5}, ("rms_per_head", 1e-5)),
        ({"model_type": "olmo2"}, ("rms_across_heads", 1e-5)),
        ({"model_type": "olmo3", "layer_types": FULL}, ("rms_across_heads", 1e-5)),
        # (query_pre_attn_scalar = head_dim: the scale these layers have)
        (
            {"model_type": "gemma3_text", "layer_types": FULL, "query_pre_attn_scalar": 16},
            (GEMMA, 1e-6),
        ),
        # Gemma 3's multimodal config.json: the language model's keys under text_config.
        (
            {
                "model_type": "gemma3",
                "text_config": {
                    "rms_norm_eps": 1e-5,
                    "layer_types": FULL,
                    "query_pre_attn_scalar": 16,
                },
            },
            ("gemma_rms_per_head", 1e-5),
        ),
        ({"model_type": "exaone4"}, ("rms_per_head", 1e-5)),
        (
            {"model_type": "lfm2", "norm_eps": 1e-4, "layer_types": ["full_attention"]},
            ("rms_per_head", 1e-4),
        ),
        ({"model_type": "hunyuan_v1_dense"}, ("rms_per_head_after_rope", 1e-5)),
        ({"model_type": "llama4_text", "no_rope_layers": [1]}, ("l2_after_rope", 1e-5)),
        ({"model_type": "llama4_text", "no_rope_layers": [1], "use_qk_norm": False}, None),
        ({"model_type": "llama4_text", "no_rope_layers": [0]}, None),  # a NoPE layer: none
        ({"model_type": "glm4_moe"}, None),  # use_qk_norm defaults to false
        ({"model_type": "glm4_moe", "use_qk_norm": True}, ("rms_per_head", 1e-5)),
        ({"model_type": "cohere"}, None),
        ({"model_type": "llama"}, None),
    ],
)
def test_attention_arguments_read_each_familys_norm(config, expected):
    config = {**config}
    text = config.get("text_config")
    if text is not None:
        config["text_config"] = {**SIZES, **text}
    else:
        config.update(SIZES)
    arguments = attention_arguments(config, layer_index=0)
    found = arguments.get("query_key_norm"), arguments.get("query_key_norm_epsilon")
    assert found == (expected or (None, None))


@pytest.mark.parametrize(
    "config, message",
    [
        ({"model_type": "gemma4_text"}, r"gemma4_text config normalizes .*v_norm"),
        ({"model_type": "cohere", "use_qk_norm": True}, r"cohere .*use_qk_norm=True.*LayerNorm"),
        ({"model_type": "phi", "qk_layernorm": True}, r"phi .*qk_layernorm=True.*bias"),
        ({"model_type": "stablelm", "qk_layernorm": True}, r"stablelm .*qk_layernorm=True"),
        ({"model_type": "qwen3", "rms_norm_eps": None}, r"config\['rms_norm_eps'\] must be"),
    ],
)
def test_from_transformers_config_refuses_norms_it_lacks(config, message):
    with pytest.raises(ValueError, match=message):
        RotaryGroupQueryAttention.from_transformers_config({**SIZES, **config}, layer_index=0)


def test_multi_head_attention_reads_and_computes_the_same_norms():
    """`RotaryMultiHeadAttention` (equal head counts) gives what the grouped layer gives."""
    config = {**SIZES, "model_type": "olmo2", "num_key_value_heads": 4, "rms_norm_eps": 0.05}
    grouped = RotaryGroupQueryAttention.from_transformers_config(config, layer_index=0)
    multi = RotaryMultiHeadAttention.from_transformers_config(config, layer_index=0)
    assert multi.get_config()["query_key_norm"] == "rms_across_heads"
    assert multi.get_config()["query_key_norm_epsilon"] == 0.05
    x = _RNG.normal(size=(2, 5, 64)).astype(np.float32)
    grouped(x, x)
    multi(x, x)
    _scaled(grouped)
    multi.set_weights(grouped.get_weights())  # same shapes, same order
    np.testing.assert_allclose(
        np.asarray(multi(x, x, use_causal_mask=True)),
        np.asarray(grouped(x, x, use_causal_mask=True)),
        rtol=0,
        atol=1e-6,
    )
