"""The export job: `python -m export` from the repository root.

With no arguments it builds the default encoders (`export.encoders`), writes each one's
SavedModel, ONNX file and verification report to `export/artifacts/<name>/`, and prints
a table of the errors and latencies. See `python -m export --help`.
"""

import os

# Before anything imports Keras: keras_posenc needs the TensorFlow backend.
os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from keras_posenc.export.cli import main  # noqa: E402

__all__ = ["main"]
