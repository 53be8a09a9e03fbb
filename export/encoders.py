"""The default encoders live in the package: `keras_posenc.export.encoders`."""

from keras_posenc.export.encoders import *  # noqa: F403
from keras_posenc.export.encoders import (
    DEFAULT_ENCODERS,
    EncoderBlock,
    EncoderSpec,
    build_encoder,
    seed_weights,
)

__all__ = ["DEFAULT_ENCODERS", "EncoderBlock", "EncoderSpec", "build_encoder", "seed_weights"]
