"""The reshape-sizes pass: a `Reshape` to a computed shape takes its sizes as TensorFlow does.

tf2onnx writes TensorFlow's reshapes with `allowzero=0`, where a size that is 0 at run
time copies the input's axis; TensorFlow's reshape (and Keras) takes the 0. A target
computed from shapes (no literal 0 in it, which would be tf2onnx's own "copy") gets
`allowzero=1`: the same for every non-empty axis, Keras's answer for an empty one, and
sizes that `SymbolicShapes` can follow (what lets `cse` prove more shapes equal).
"""

from __future__ import annotations

import onnx
from onnx import helper

from keras_posenc.export.onnx_passes.shapes import SymbolicShapes

__all__ = ["literal_reshape_sizes"]

# `allowzero` came with opset 14.
_ALLOWZERO_OPSET = 14


def literal_reshape_sizes(proto: onnx.ModelProto) -> int:
    """Sets `allowzero=1` on each `Reshape` to a computed shape, in place; returns how many.

    Found: the main graph's ONNX `Reshape`s without `allowzero`. Checked: the target's
    value is followed (`SymbolicShapes.value`), holds no literal 0 and is not all
    constant. Opset 14 and later.
    """
    opset = next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), 0)
    if opset < _ALLOWZERO_OPSET:
        return 0
    shapes = SymbolicShapes.of_graph(proto.graph)
    changed = 0
    for node in proto.graph.node:
        if node.op_type != "Reshape" or node.domain not in ("", "ai.onnx"):
            continue
        if any(a.name == "allowzero" and a.i for a in node.attribute):
            continue
        target = shapes.value(node.input[1])
        if target is None or (0, ()) in target[1] or all(not s[1] for s in target[1]):
            continue
        node.attribute.extend([helper.make_attribute("allowzero", 1)])
        changed += 1
    return changed
