"""`DecoderBlock` and `decoder_models`: the float64 reference, the cache, config and files."""

from __future__ import annotations

import keras
import numpy as np
import pytest
from decoder_reference import reference_greedy

from keras_posenc import DecoderBlock, decoder_models
from keras_posenc.export.decoder import check, decoder_cases, keras_greedy

VOCABULARY, WIDTH, MAX_LENGTH = 30, 32, 24


def models(mlp="swiglu"):
    blocks = [DecoderBlock(8, 4, 2, 48, mlp=mlp, name=f"block_{i}") for i in range(2)]
    embedding = keras.layers.Embedding(VOCABULARY, WIDTH, embeddings_initializer="normal")
    return decoder_models(
        embedding, blocks, keras.layers.RMSNormalization(), keras.layers.Dense(VOCABULARY), 24
    )


@pytest.mark.parametrize("mlp", ["swiglu", "gelu"])
def test_cached_decoding_matches_a_float64_decoder(mlp):
    _, step = models(mlp)
    case = decoder_cases(VOCABULARY, MAX_LENGTH)[1]  # left-padded batch of 4
    prompts, mask = case["prompts"], case["mask"]
    expected = reference_greedy(step, prompts, mask, 8)
    result = check.compare_greedy(expected, keras_greedy(step, prompts, mask, 8), mask)
    assert result["passed"], result


def test_training_model_is_the_cached_prefill():
    train, step = models()
    ids = np.random.default_rng(0).integers(0, VOCABULARY, (2, 9)).astype("int32")
    feeds = {
        "token_ids": ids,
        "cache": np.zeros((2, 2, 2, MAX_LENGTH, 2, 8), "float32"),
        "cache_update_index": np.int32(0),
        "padding_mask": np.ones((2, MAX_LENGTH), "int32"),
    }
    np.testing.assert_allclose(train(ids), step(feeds)["logits"], atol=1e-5, rtol=1e-5)


def test_config_round_trip_and_keras_file(tmp_path):
    block = DecoderBlock(
        8, 4, 2, 48, mlp="gelu", rope_scaling={"rope_type": "linear", "factor": 2.0}
    )
    x = np.random.default_rng(0).normal(size=(2, 5, WIDTH)).astype("float32")
    expected = block(x)
    config = block.get_config()
    clone = DecoderBlock.from_config(config)
    assert clone.get_config() == config
    inputs = keras.Input((None, WIDTH))
    model = keras.Model(inputs, block(inputs))
    model.save(tmp_path / "m.keras")
    loaded = keras.saving.load_model(tmp_path / "m.keras")
    np.testing.assert_array_equal(loaded(x), expected)


def test_bad_arguments():
    with pytest.raises(ValueError, match="mlp must be one of"):
        DecoderBlock(8, 4, 2, 48, mlp="relu")
    with pytest.raises(ValueError, match="known width"):
        DecoderBlock(8, 4, 2, 48).build((None, None, None))
    with pytest.raises(TypeError, match="DecoderBlock"):
        decoder_models(None, [keras.layers.Dense(3)], None, None, 8)
