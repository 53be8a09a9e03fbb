"""The reshape-sizes pass (`onnx_passes.reshape_sizes`): a 0 in a computed target is a 0.

Run in onnxruntime against TensorFlow's reshape, on an empty axis and a full one.
"""

from __future__ import annotations

import hand_built
import numpy as np
import onnx
import tensorflow as tf
from onnx import TensorProto, helper

from keras_posenc.export import onnx_passes

_model, _int64 = hand_built.model, hand_built.int64


def _run(proto: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    return hand_built.session(proto).run(None, feeds)


def test_a_reshape_to_a_computed_shape_takes_an_empty_axis_as_tensorflow_does():
    # (b, s, 8) -> (s, b, 8), the sizes read from the input: with s = 0 ONNX's default
    # (allowzero=0) copies b into the 0 and fails; TensorFlow reshapes to (0, b, 8).
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Gather", ["shape", "length_batch"], ["swapped"]),
        helper.make_node("Concat", ["swapped", "width"], ["target"], axis=0),
        helper.make_node("Reshape", ["x", "target"], ["computed"]),
        helper.make_node("Reshape", ["x", "copy_first"], ["copied"]),
    ]
    proto = _model(
        nodes,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", "s", 8])],
        [
            helper.make_tensor_value_info("computed", TensorProto.FLOAT, [None] * 3),
            helper.make_tensor_value_info("copied", TensorProto.FLOAT, [None] * 2),
        ],
        [_int64("length_batch", [1, 0]), _int64("width", [8]), _int64("copy_first", [0, -1])],
    )
    assert onnx_passes.literal_reshape_sizes(proto) == 1  # the literal 0 stays a copy
    onnx.checker.check_model(proto, full_check=True)
    for shape in [(3, 0, 8), (2, 5, 8)]:
        x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
        computed, copied = _run(proto, {"x": x})
        expected = tf.reshape(x, (shape[1], shape[0], 8)).numpy()
        assert computed.shape == expected.shape
        np.testing.assert_array_equal(computed, expected)
        assert copied.shape == (shape[0], shape[1] * 8)
