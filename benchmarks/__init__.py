"""Speed of the keras_posenc layers against the memory floor and keras_hub, and their precision.

`python -m benchmarks` (speed) and `python -m benchmarks.precision`, from the repository root;
`docs/benchmarks.md` and `docs/precision.md` hold the latest results and how they are made.
"""

import importlib.util
import sys
from pathlib import Path

# The tests' float64 references, loaded by path: an installed package named `tests`
# (tf2onnx ships one) would shadow the repository's folder on import. `reference.py`
# imports its sibling `float32_error` as pytest makes it importable: from the folder.
_TESTS = Path(__file__).resolve().parent.parent / "tests"
if str(_TESTS) not in sys.path:
    sys.path.append(str(_TESTS))
_spec = importlib.util.spec_from_file_location("benchmarks.reference", _TESTS / "reference.py")
reference = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(reference)
