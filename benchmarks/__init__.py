"""Speed of the keras_posenc layers against the memory floor and keras_hub, and their precision.

`python -m benchmarks` (speed) and `python -m benchmarks.precision`, from the repository root;
`docs/benchmarks.md` and `docs/precision.md` hold the latest results and how they are made.
"""

import importlib.util
from pathlib import Path

# The tests' float64 references, loaded by path: an installed package named `tests`
# (tf2onnx ships one) would shadow the repository's folder on import.
_spec = importlib.util.spec_from_file_location(
    "benchmarks.reference", Path(__file__).resolve().parent.parent / "tests" / "reference.py"
)
reference = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(reference)
