"""The Erfc pass (`onnx_passes.erfc`): `1 - Erf` in place of `Erfc`, within float32."""

from __future__ import annotations

import math

import hand_built
import numpy as np
import onnx

from keras_posenc.export import onnx_passes

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
    # Within one float32 step at 2 (the largest value): the absolute precision it keeps.
    np.testing.assert_allclose(actual, expected, rtol=0, atol=2.0**-22)
