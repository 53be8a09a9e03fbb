"""A successful export prints nothing of the converters' own: their lines go to DEBUG."""

from __future__ import annotations

import logging
import re
import sys
import warnings

import keras
import pytest

from keras_posenc import RotaryMultiHeadAttention
from keras_posenc import export as kpe

NATIVE_LOG_LINE = re.compile(r"^[IWE]\d{4} \d\d:\d\d:\d\d", re.MULTILINE)


@pytest.fixture(scope="module")
def gelu_model():
    """Exact gelu: tf2onnx leaves its Erfc unconverted (logged at ERROR), the package fixes it."""
    x = keras.Input((None, 16), name="x")
    y = RotaryMultiHeadAttention(2, 8)(x, x)
    return keras.Model(x, keras.layers.Dense(8, activation="gelu")(y))


def test_a_successful_export_prints_no_converter_lines(gelu_model, tmp_path, capfd):
    capfd.readouterr()
    kpe.save_onnx(gelu_model, tmp_path / "model.onnx")
    kpe.save_litert(gelu_model, tmp_path / "model.tflite")
    out, err = capfd.readouterr()
    assert "Erfc" not in out + err
    assert "Unsupported ops" not in out + err
    assert not NATIVE_LOG_LINE.search(err), err[-2000:]
    assert (tmp_path / "model.onnx").is_file() and (tmp_path / "model.tflite").is_file()


def test_the_converters_lines_are_debug_records_of_the_package(gelu_model, tmp_path, caplog):
    with caplog.at_level(logging.DEBUG, logger="keras_posenc.export"):
        kpe.save_onnx(gelu_model, tmp_path / "model.onnx")
    assert any("Erfc" in record.getMessage() for record in caplog.records)
    # Back as they were: tf2onnx's own logger propagates again.
    assert logging.getLogger("tf2onnx").propagate


def test_tensorflows_interpreter_loads_without_its_deprecation_warning(
    gelu_model, tmp_path, monkeypatch
):
    kpe.save_litert(gelu_model, tmp_path / "model.tflite")
    monkeypatch.setitem(sys.modules, "ai_edge_litert", None)  # the optional extra absent
    monkeypatch.setitem(sys.modules, "ai_edge_litert.interpreter", None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        interpreter = kpe.litert_interpreter(tmp_path / "model.tflite")
    assert type(interpreter).__module__.startswith("tensorflow")
    assert not [w for w in caught if "deprecated" in str(w.message)]
