"""TensorFlow, and the package's TensorFlow tricks (`keras_posenc.backend.tensorflow`), imported on
first use.

Modules every backend imports refer to TensorFlow through these names, so on JAX and
PyTorch the package never imports it: a process there needs no TensorFlow installed, and
TensorFlow does not start on (and claim the memory of) the GPU beside JAX or PyTorch. On
the TensorFlow backend the first attribute read imports the module; each name read is
then kept, so a read costs what a module attribute costs.

`tricks()` is the backend's tricks module, which the code written once for every backend
asks what differs between them.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from keras.backend import backend


class LazyModule:
    """Stands for the module `name` and imports it when one of its attributes is read."""

    def __init__(self, name: str):
        self._name = name
        self._module: ModuleType | None = None

    def __getattr__(self, attribute: str):
        if attribute.startswith("__"):
            raise AttributeError(attribute)  # copy, pickle and inspect probe these
        if self._module is None:
            self._module = importlib.import_module(self._name)
        value = getattr(self._module, attribute)
        setattr(self, attribute, value)  # read from the instance from now on
        return value

    def __repr__(self) -> str:
        state = "imported" if self._module is not None else "not imported yet"
        return f"<lazy module {self._name!r}, {state}>"


tf = LazyModule("tensorflow")
tf_backend = LazyModule("keras_posenc.backend.tensorflow")


keras_ops_backend = LazyModule("keras_posenc.backend.keras_ops")


def tricks():
    """This backend's tricks: `keras_posenc.backend.tensorflow` on TensorFlow, else
    `keras_posenc.backend.keras_ops`
    (JAX, PyTorch), each imported on first use. Both give the same names, each answering for
    its backend (see `keras_posenc.backend.keras_ops`)."""
    return tf_backend if backend() == "tensorflow" else keras_ops_backend
