"""The export job: `python -m export` from the repository root (`keras-posenc-export` installed).

With no arguments it builds the default encoders (`keras_posenc.export.encoders`), writes
each one's SavedModel, ONNX file, LiteRT file and verification report to
`export/artifacts/<name>/`, and prints a table of the errors and latencies. See
`python -m export --help`. The code lives in the package (`keras_posenc.export.cli`); this
folder keeps the repository's layout. Importing it imports nothing heavy, so that
`python -m export` can quiet TensorFlow before Keras loads it (`keras_posenc_cli`).
"""

import os

# Before anything imports Keras: keras_posenc needs the TensorFlow backend.
os.environ.setdefault("KERAS_BACKEND", "tensorflow")


def main(argv=None) -> int:
    """Runs the export job (see `keras_posenc_cli.main`)."""
    from keras_posenc_cli import main as run

    return run(argv, prog="python -m export")


__all__ = ["main"]
