"""TensorFlow's outputs of every backend test case: what the JAX and PyTorch runs compare with.

tests/test_backends.py hands them to the test processes (`POSENC_TF_RESULTS`);
`python tests/backends/tensorflow_results.py RESULTS.npz` writes them for a machine without
TensorFlow (`benchmarks/gpu.sh`). The encoder cases by name (`cases.py`), the attention
cases as `attention:<case>:<output>` (`attention_cases.py`).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np


def outputs() -> dict[str, np.ndarray]:
    """Every case's eager output under TensorFlow (Keras must run on it)."""
    import attention_cases
    import cases

    results = {name: cases.run(name) for name in cases.CASES}
    for name in attention_cases.CASES:
        for output, value in attention_cases.run(name).items():
            results[f"attention:{name}:{output}"] = value
    return results


if __name__ == "__main__":
    os.environ["KERAS_BACKEND"] = "tensorflow"
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    results = outputs()
    np.savez(sys.argv[1], **results)
    print(f"{len(results)} outputs in {sys.argv[1]}")
