"""A small helper for writing ONNX graphs node by node with `onnx.helper`."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from keras_posenc.export.decoder import weights_file

MICROSOFT = "com.microsoft"


class GraphBuilder:
    """Nodes and initializers of one graph, with unique names made from a prefix."""

    def __init__(self):
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self._names: set[str] = set()
        self._constants: dict[tuple, str] = {}
        self.standard = False  # ONNX's own operators only (no onnxruntime contrib ops)

    def name(self, base: str) -> str:
        name, count = base, 0
        while name in self._names:
            count += 1
            name = f"{base}_{count}"
        self._names.add(name)
        return name

    def initializer(self, base: str, array: np.ndarray, data_type=None, dims=None) -> str:
        """A named initializer (a weight, a table); written to the file at once while a
        weights file is open (`weights_file.streaming`) and it is not a small constant.
        `data_type` and `dims` given: `array` is the tensor's raw bytes (int4's two a byte)."""
        name = self.name(base)
        weights = weights_file.current()
        array = np.asarray(array)
        if weights is not None and weights.takes(array):
            self.initializers.append(weights.tensor(name, array, data_type, dims))
        elif data_type is not None:
            tensor = onnx.TensorProto(name=name, data_type=data_type, dims=list(dims))
            tensor.raw_data = np.ascontiguousarray(array).tobytes()
            self.initializers.append(tensor)
        else:
            self.initializers.append(numpy_helper.from_array(np.ascontiguousarray(array), name))
        return name

    def constant(self, value, dtype) -> str:
        """A small constant initializer, shared by every use of the same value."""
        array = np.asarray(value, dtype)
        key = (array.dtype.str, array.shape, array.tobytes())
        if key not in self._constants:
            self._constants[key] = self.initializer("const", array)
        return self._constants[key]

    def node(self, op: str, inputs: list[str], outputs=1, domain: str = "", **attributes):
        """Adds a node; returns its output name (one output) or names (`outputs` a count
        above 1, or a list of names, where `""` leaves an output unused)."""
        if isinstance(outputs, int):
            names = [self.name(f"{op}_out") for _ in range(outputs)]
        else:
            names = list(outputs)
            self._names.update(name for name in names if name)
        self.nodes.append(
            helper.make_node(
                op, inputs, names, name=self.name(f"{op}_node"), domain=domain, **attributes
            )
        )
        return names[0] if len(names) == 1 else names

    def model(
        self, inputs, outputs, opset: int, name: str = "decoder", contrib: bool = True
    ) -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, name, inputs, outputs, self.initializers)
        opsets = [helper.make_opsetid("", opset)]
        if contrib:
            opsets.append(helper.make_opsetid(MICROSOFT, 1))
        model = helper.make_model(graph, opset_imports=opsets, producer_name="keras_posenc")
        model.ir_version = min(model.ir_version, 10)
        return model
