"""The Erfc pass (`onnx_passes.erfc`): `1 - Erf` in place of `Erfc`, within float32."""

from __future__ import annotations

import math

import hand_built
import numpy as np
import onnx
from float32_error import U, assert_within_bound

from keras_posenc.export import onnx_passes

ERF_ULPS = 4  # onnxruntime's float32 Erf: within 1 ulp on [-6, 6] here (1e5 points); 4 leaves room

_session = hand_built.session


def test_erfc_rewrite_matches_erfc_in_float32():
    # 1 - Erf (run by onnxruntime) against erfc in float64, on a graph of nothing but the op.
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Erfc", ["x"], ["y"], name="erfc")],
        "erfc",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None])],
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    assert onnx_passes.replace_erfc(proto) == 1
    onnx.checker.check_model(proto, full_check=True)
    values = np.linspace(-6, 6, 97, dtype=np.float32)
    (actual,) = _session(proto).run(None, {"x": values})
    expected = np.array([math.erfc(v) for v in values.astype(np.float64)])
    assert actual.dtype == np.float32
    # `1 - erf(x)`: onnxruntime's float32 erf within ERF_ULPS ulp, then the
    # subtraction's one rounding of |erfc| <= 2. Not relative to erfc: the rewrite keeps
    # only erf's absolute precision (erfc(6) = 2e-17 comes out 0).
    erf = np.abs(np.array([math.erf(v) for v in values.astype(np.float64)]))
    bound = 2 * ERF_ULPS * U * erf + U * (expected + 2 * ERF_ULPS * U)  # an ulp <= 2u|v|
    assert_within_bound(actual, expected, bound, what="1 - Erf")
