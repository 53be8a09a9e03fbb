"""`save_decoder`'s quantization arguments: a value the file would not carry is refused by
name, never ignored, and the arguments that need no model are refused before it is read.

`block_size` / `accuracy_level` default to None (block 32, level 4 when `quantize` asks
for weights quantized at export); given for a float model without `quantize`, for a model
Keras quantized (its blocks are its own; its int8 products carry no level), or for a
LiteRT file (no level; int8 per channel), each is refused, naming the argument.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
from keras.src.quantizers.gptq import GPTQ
from keras_hub_models import tiny_causal_lm
from keras_quantizing import without_collection_per_variable
from test_decoder_save import step_model

from keras_posenc.export import save_decoder
from keras_posenc.export.decoder import save
from keras_posenc.export.errors import ExportError

MAX_LENGTH = 24


@pytest.fixture(scope="module")
def float_step():
    keras.utils.set_random_seed(0)
    return step_model(layers=1)


def _keras_quantized(mode: str):
    keras.utils.set_random_seed(0)
    model = step_model(layers=1)
    with without_collection_per_variable():
        model.quantize(mode)
    return model


@pytest.fixture
def never_described(monkeypatch):
    """`save_decoder` fails the test if it reads the model: what is refused here is
    known from the arguments alone."""

    def described(*args, **kwargs):
        raise AssertionError("the model was described before the refusal")

    monkeypatch.setattr(save, "_described", described)


@pytest.mark.parametrize("name, value", [("block_size", 64), ("accuracy_level", 0)])
def test_float_model_without_quantize_refuses_quantization_settings(
    float_step, tmp_path, name, value
):
    with pytest.raises(ExportError, match=f"{name}={value!r} is not used: the model is float"):
        save_decoder(float_step, tmp_path / "q", max_length=MAX_LENGTH, verbose=0, **{name: value})
    assert not (tmp_path / "q").exists()


@pytest.mark.parametrize(
    "options, match",
    [
        ({"quantize": "int8", "block_size": 32}, "block_size=32 is not used: LiteRT's int8"),
        ({"quantize": "int4", "accuracy_level": 4}, "accuracy_level=4 is not used: LiteRT"),
    ],
)
def test_litert_refuses_what_it_does_not_carry_before_reading_the_model(
    float_step, tmp_path, never_described, options, match
):
    with pytest.raises(ExportError, match=match):
        save_decoder(
            float_step, tmp_path / "q", max_length=MAX_LENGTH, formats=("litert",), **options
        )
    assert not (tmp_path / "q").exists()


def test_keras_int8_refuses_an_accuracy_level_and_int4_a_block_size(tmp_path):
    int8 = _keras_quantized("int8")
    with pytest.raises(ExportError, match="accuracy_level=4 is not used: Keras's rounded rows"):
        save_decoder(int8, tmp_path / "a", max_length=MAX_LENGTH, verbose=0, accuracy_level=4)
    int4 = _keras_quantized("int4")
    with pytest.raises(ExportError, match="block_size=64 is not used: the model Keras quantized"):
        save_decoder(int4, tmp_path / "b", max_length=MAX_LENGTH, verbose=0, block_size=64)
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


@pytest.mark.parametrize(
    "options, error, match",
    [
        ({"symmetric": 0, "quantize": "int4"}, TypeError, "symmetric must be True or False"),
        ({"symmetric": False}, ValueError, "a model Keras quantized keeps its own blocks"),
        ({"block_size": 24}, ValueError, "block_size"),
        ({"accuracy_level": 5}, ValueError, "accuracy_level must be one of"),
        ({"prompt_template": {"user": {"prefix": "<u>"}}}, ValueError, "prompt_template="),
        (
            {"prompt_template": 42, "formats": ("litertlm",), "tokenizer": object()},
            TypeError,
            "prompt_template must be a mapping",
        ),
    ],
)
def test_bad_arguments_are_refused_before_the_model_is_read(
    float_step, tmp_path, never_described, options, error, match
):
    with pytest.raises(error, match=match):
        save_decoder(float_step, tmp_path / "q", max_length=MAX_LENGTH, verbose=0, **options)
    assert not (tmp_path / "q").exists()


def test_a_bfloat16_gptq_model_is_refused_by_name(tmp_path):
    """Its float32 copy would be rebuilt uncalibrated (and read as float): refused."""
    keras.utils.set_random_seed(0)
    keras.config.set_dtype_policy("mixed_bfloat16")
    try:
        model = step_model(layers=1)
    finally:
        keras.config.set_dtype_policy("float32")
    head = [layer for layer in model.layers if isinstance(layer, keras.layers.Dense)][-1]
    config = keras.quantizers.GPTQConfig(dataset=[0], tokenizer=object(), group_size=16)
    with without_collection_per_variable():
        head.quantize("gptq", config=config)
    quantizer = GPTQ(head, config)  # Keras's own calibration of the layer
    rows = np.random.default_rng(0).standard_normal((8, quantizer.rows)).astype(np.float32)
    quantizer.update_hessian_with_batch(rows)
    quantizer.quantize_and_correct_layer()
    assert head.quantization_mode == "gptq"
    with pytest.raises(ExportError, match="quantized by Keras as 'gptq' and computes in bfloat16"):
        save_decoder(model, tmp_path / "q", max_length=MAX_LENGTH, verbose=0)
    assert not (tmp_path / "q").exists()


def test_quantize_embedding_on_a_tied_model_is_refused_by_name(tmp_path):
    """Its table is the head's int4 blocks already: the option would change nothing."""
    causal_lm = tiny_causal_lm("llama", tie_word_embeddings=True)
    with pytest.raises(ExportError, match="quantize_embedding=True, but the model's embedding"):
        save_decoder(
            causal_lm,
            tmp_path / "q",
            max_length=MAX_LENGTH,
            verbose=0,
            quantize="int4",
            quantize_embedding=True,
        )
    assert not (tmp_path / "q").exists()
