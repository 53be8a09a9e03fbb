"""A dynamic NTK layer's ONNX and LiteRT files are as exact as the layer: within 1e-6 of the
float64 formula at starts up to 2^20, where float32 frequencies were off by 5e-2.

The files compute the frequencies in their graphs (the total length is an input), with the
same float32 word arithmetic as TensorFlow's graph (`keras_posenc.rope.dynamic_ntk`); onnxruntime
and LiteRT run it with their own kernels.
"""

from __future__ import annotations

import sys
from pathlib import Path

import keras
import numpy as np
import pytest

from keras_posenc import RotaryEmbedding
from keras_posenc import export as kpe
from keras_posenc.export.verify.runtimes import artifact_runners

sys.path.insert(0, str(Path(__file__).resolve().parent / "backends"))
from dynamic_ntk_cases import SMALL, inputs, reference  # noqa: E402

BOUND = 1e-6  # the target, from the float64 formula
STARTS = (1000, 100_000, 2**20 - 8)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    folder = tmp_path_factory.mktemp("dynamic_ntk")
    heads = keras.Input((None, 2, 64), name="heads")
    start = keras.Input(batch_shape=(), dtype="int32", name="start_index")
    rotated = RotaryEmbedding(layout="half", scaling=SMALL)(heads, start_index=start)
    model = keras.Model({"heads": heads, "start_index": start}, {"rotated": rotated})
    fused = kpe.save_onnx(model, folder / "fused.onnx", rotary="fused")
    decomposed = kpe.save_onnx(model, folder / "decomposed.onnx", rotary="decomposed")
    litert_path = kpe.save_litert(model, folder / "dynamic.tflite")
    return {
        "onnx_fused": artifact_runners({"onnxruntime": fused})["onnxruntime"],
        "onnx_decomposed": artifact_runners({"onnxruntime": decomposed})["onnxruntime"],
        "litert": artifact_runners({"litert": litert_path})["litert"],
    }


@pytest.mark.parametrize("runtime", ["onnx_fused", "onnx_decomposed", "litert"])
def test_exported_dynamic_ntk_is_within_1e6_of_float64(exported, runtime):
    errors = {}
    for first in STARTS:
        case = {"scaling": SMALL, "dim": 64, "start": first, "length": 8}
        feeds = {"heads": inputs(case), "start_index": np.array(first, np.int32)}
        output = exported[runtime](feeds)["rotated"]
        errors[first] = float(np.abs(output - reference(case)).max())
    assert max(errors.values()) <= BOUND, errors
