"""The export job: `python -m export` from the repository root (`keras-posenc-export` installed).

With no arguments it builds the default encoders, writes each one's SavedModel, ONNX file,
LiteRT file and verification report to `export/artifacts/<name>/`, and prints a table of
the errors and latencies; see `python -m export --help`. This folder is only the entry:
the arguments are `keras_posenc_cli.arguments`, the job `keras_posenc_cli.job`.
Importing it imports nothing heavy, so that `--help` answers without TensorFlow.
"""


def main(argv=None) -> int:
    """Runs the export job (see `keras_posenc_cli.main`)."""
    from keras_posenc_cli import main as run

    return run(argv, prog="python -m export")


__all__ = ["main"]
