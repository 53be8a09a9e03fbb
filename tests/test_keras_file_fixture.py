"""A `.keras` file written by an older main still loads and computes what its layers say.

`tests/fixtures/saved_by_main_2026_12_07.keras` was written by `tests/saved_by_main.py` before
the package's modules moved into folders (issue #38). Keras finds each layer by its registered
name (`keras_posenc>Name`), so the file must load whatever module a class lives in now, with the
same configuration and weights giving the same outputs as the model built from its constructors.
"""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import keras
import numpy as np

import keras_posenc
from tests import saved_by_main

FIXTURE = Path(__file__).parent / "fixtures" / "saved_by_main_2026_12_07.keras"
PACKAGE_LAYERS = {
    "SinusoidalPositionalEncoding",
    "LearnedPositionalEmbedding",
    "RotaryMultiHeadAttention",
    "RotaryGroupQueryAttention",
    "DecoderBlock",
    "AttentionTemperature",
    "RotaryEmbedding",
}


def _without_name(config: dict) -> dict:
    return {key: value for key, value in config.items() if key != "name"}


def test_the_fixture_holds_every_serializable_layer_of_the_package():
    config = json.loads(zipfile.ZipFile(FIXTURE).read("config.json"))
    saved = {layer["class_name"] for layer in config["config"]["layers"]}
    assert PACKAGE_LAYERS <= saved
    for name in PACKAGE_LAYERS:
        assert name in keras_posenc.__all__


def test_a_file_saved_by_an_older_main_loads_with_the_same_layers_and_outputs():
    loaded = keras.models.load_model(FIXTURE)
    built = saved_by_main.build_model()
    loaded_layers = [layer for layer in loaded.layers if type(layer).__name__ in PACKAGE_LAYERS]
    built_layers = [layer for layer in built.layers if type(layer).__name__ in PACKAGE_LAYERS]
    assert [type(layer) for layer in loaded_layers] == [type(layer) for layer in built_layers]
    for old, new in zip(loaded_layers, built_layers, strict=True):
        assert _without_name(old.get_config()) == _without_name(new.get_config())
        assert getattr(keras_posenc, type(old).__name__) is type(old)
    built.set_weights(loaded.get_weights())
    inputs = saved_by_main.inputs()
    np.testing.assert_array_equal(
        keras.ops.convert_to_numpy(loaded(inputs)), keras.ops.convert_to_numpy(built(inputs))
    )
