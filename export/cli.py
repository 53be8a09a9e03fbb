"""The export job's code lives in the package: `keras_posenc.export.cli`."""

from keras_posenc.export.cli import *  # noqa: F403
from keras_posenc.export.cli import main

__all__ = ["main"]
