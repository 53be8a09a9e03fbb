"""Serve a SavedModel exported by Keras from JAX, in a fresh TensorFlow process.

Run by tests/backends/test_symbolic_export.py as `python serve_keras_export.py FOLDER` with
`KERAS_BACKEND=tensorflow`, after it wrote `FOLDER/saved_model` (`model.export(...,
format="tf_saved_model")` of a model whose input is `keras.Input((None,))`) and
`FOLDER/tokens.npz` (`tokens_N`: int32 `(2, N)`). Writes `FOLDER/served.npz`: `outputs_N`
of the reloaded SavedModel's `serve` for each `tokens_N`, or `FOLDER/error.txt` where
TensorFlow cannot load or run it (tests/stablehlo_versions.py).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import tensorflow as tf


def main(folder: Path) -> None:
    try:
        served = tf.saved_model.load(str(folder / "saved_model"))
        tokens = np.load(folder / "tokens.npz")
        outputs = {
            name.replace("tokens", "outputs"): served.serve(tf.constant(tokens[name])).numpy()
            for name in tokens.files
        }
    except Exception as error:  # noqa: BLE001 - reported, and judged by the test
        (folder / "error.txt").write_text(f"{type(error).__name__}: {error}")
        return
    np.savez(folder / "served.npz", **outputs)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
