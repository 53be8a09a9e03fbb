"""The as-written check of an int8 `QMoE` file (int8 activations): it fails a wrong file.

onnxruntime's CPU QMoE rounds the inputs of 8-bit experts to int8, so the file as written
is judged against the int8-activation bound, and from a row's first router tie within
that bound on the row is not compared (`quantized_routers.py`). With the tiny GPT-OSS's
random routers 7 rows are released (at accuracy_level 0), and a file with an expert scale
times 1.5 fails as written in one case of three. Here the routers are tie-free by
construction: the bias puts two experts 6 above the other two and the router's kernel is
small enough that no logit moves by 1; no row is released, the right file passes as
written and the wrong one fails as written in every case.
"""

from __future__ import annotations

import functools

import numpy as np
import onnx
import pytest
from keras_hub_models import MAX_LENGTH, tiny_gpt_oss
from onnx import numpy_helper

from keras_posenc.export import save_decoder
from keras_posenc.export.decoder import runtime_version, save
from keras_posenc.export.decoder.progress import Progress
from keras_posenc.export.decoder.quantized_graph import Quantization
from keras_posenc.export.decoder.quantized_save import verify_quantized_decoder
from keras_posenc.keras_hub import describe_causal_lm

pytestmark = pytest.mark.skipif(
    runtime_version._installed() < runtime_version.VERIFIED_FROM,
    reason="GPT-OSS's sinks and QMoE's accuracy_level need onnxruntime 1.32",
)
AS_WRITTEN = "onnxruntime"
INT8 = Quantization(8, 32, 0)


@functools.cache
def _tie_free():
    causal_lm = tiny_gpt_oss()
    for v in causal_lm.backbone.weights:
        if v.path.endswith("router_dense/bias"):
            v.assign(np.array([3.0, 3.0, -3.0, -3.0], np.float32))
        elif v.path.endswith("router_dense/kernel"):
            kernel = np.asarray(v.numpy(), np.float32)
            # |x @ kernel| <= ||x|| ||kernel column||: the router's input (a normed
            # hidden state, RMS ~ 1 times the norm's scale) kept well under 1 by a small kernel.
            v.assign(kernel * (0.02 / np.abs(kernel).max()))
    return causal_lm


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    folder = tmp_path_factory.mktemp("int8_qmoe") / "q"
    save_decoder(
        _tie_free(),
        folder,
        max_length=MAX_LENGTH,
        verbose=0,
        quantize="int8",
        accuracy_level=0,
        verify=False,
    )
    return folder, onnx.load(folder / "model.onnx")


def _verify(folder, model):
    onnx.save(model, folder / "model.onnx")
    runtimes = save._runtimes(folder, ("onnx",), MAX_LENGTH, INT8)
    runtimes = {AS_WRITTEN: runtimes[AS_WRITTEN]}  # the file as written alone
    decoder = describe_causal_lm(_tie_free(), MAX_LENGTH)
    return verify_quantized_decoder(
        _tie_free(), decoder, True, runtimes, MAX_LENGTH, INT8, Progress(0, folder)
    )


def test_the_int8_qmoe_file_as_written_passes_with_every_row_compared(written):
    folder, model = written
    report = _verify(folder, model)
    assert report["quantization"]["judged"] == "int8-activation bound"
    assert report["ties"] == []  # no row released: every token compared at every step
    assert report["passed"]
    assert all(case["runtimes"][AS_WRITTEN]["passed"] for case in report["cases"])


def test_an_int8_qmoe_file_with_a_wrong_expert_scale_fails_as_written(written):
    folder, model = written
    tampered = onnx.ModelProto()
    tampered.CopyFrom(model)
    scales = next(t for t in tampered.graph.initializer if t.name.endswith("fc1.scales"))
    array = numpy_helper.to_array(scales).copy()
    array[:, 0, 0] *= 1.5  # each expert's first gate column, its first block
    scales.CopyFrom(numpy_helper.from_array(array, scales.name))
    report = _verify(folder, tampered)
    assert report["ties"] == []
    assert not report["passed"]
    failed = [not case["runtimes"][AS_WRITTEN]["passed"] for case in report["cases"]]
    assert all(failed), failed  # every case: no row of any is released
