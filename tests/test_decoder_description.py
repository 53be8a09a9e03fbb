"""`describe_decoder`: the RoPE tables rounded once from float64, and what it refuses."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import reference

from keras_posenc import DecoderBlock, decoder_models
from keras_posenc.export.decoder import describe_decoder
from keras_posenc.export.decoder.description import optional_parts
from keras_posenc.export.errors import ExportError

LONGROPE = {
    "rope_type": "longrope",
    "short_factor": [1.0] * 8,
    "long_factor": [4.0] * 8,
    "original_max_position_embeddings": 32,
}


def step(**options):
    blocks = [DecoderBlock(16, 4, 2, 32, name=f"b{i}", **options) for i in range(2)]
    return decoder_models(
        keras.layers.Embedding(20, 32),
        blocks,
        keras.layers.RMSNormalization(),
        keras.layers.Dense(20),
        max_length=64,
    )[1]


def test_tables_are_float64_rounded_once():
    decoder = describe_decoder(step(rope_max_wavelength=500.0), 64)
    theta = reference.angles(np.arange(64), 16, 500.0)
    np.testing.assert_array_equal(decoder.rope.cos, np.cos(theta).astype(np.float32))
    np.testing.assert_array_equal(decoder.rope.sin, np.sin(theta).astype(np.float32))
    assert decoder.rope.cos.shape == (64, 8) and not decoder.rope.interleaved


def test_kernels_and_heads():
    model = step()
    decoder = describe_decoder(model, 64)
    attention = decoder.attention
    assert (attention.num_heads, attention.kv_num_heads, attention.head_dim) == (4, 2, 16)
    assert attention.query.shape == (32, 64) and attention.key.shape == (32, 32)
    assert attention.scale == pytest.approx(0.25)
    block = model.get_layer("b1")
    np.testing.assert_array_equal(decoder.blocks[1].mlp.down, block.down.kernel.numpy())
    assert decoder.head_bias is not None and decoder.num_layers == 2
    # The package's own blocks use none of keras_hub's optional parts, so every emitter
    # (GroupQueryAttention, standard ops, LiteRT) writes them whole.
    assert optional_parts(decoder) == []


def test_longrope_is_exact_below_its_switch_and_refused_past_it():
    decoder = describe_decoder(step(rope_scaling=LONGROPE), 32)
    # Below the switch: the short factors (all 1 here), attention factor 1.
    theta = reference.angles(np.arange(32), 16, 10000.0)
    np.testing.assert_array_equal(decoder.rope.cos, np.cos(theta).astype(np.float32))
    with pytest.raises(ExportError, match="passes 32.*max_length <= 32"):
        describe_decoder(step(rope_scaling=LONGROPE), 33)


def test_a_decoder_without_any_rope_block_is_refused():
    # NoPE blocks (rope_dim=0, Llama 4's and SmolLM3's every fourth layer) are written
    # without rotation (`Attention.no_rope`; tests/test_keras_hub_2026.py exports one),
    # but a decoder of NoPE blocks only has no tables for the caches: refused by name.
    with pytest.raises(ExportError, match=r"Every DecoderBlock uses no RoPE \(rope_dim=0\)"):
        describe_decoder(step(rope_dim=0), 64)
