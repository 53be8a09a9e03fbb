"""Positional encodings for Keras 3: sinusoidal, learned and rotary (RoPE).

Every layer takes its sin/cos from one shared frequency table (`keras_posenc.frequencies`),
computed in float64 on the host and rounded once, so values are exact at any position.
The layers run on the TensorFlow, JAX and PyTorch backends; the exports need TensorFlow.
"""

from keras_posenc_startup import keras_backend_configured, quiet_tensorflow_start

BACKENDS = ("tensorflow", "jax", "torch")
_BACKEND_HINT = (
    "Set the environment variable KERAS_BACKEND=tensorflow (or jax, or torch) before Python "
    "starts (or before the first `import keras`)."
)

try:
    with quiet_tensorflow_start(keras_backend_configured() == "tensorflow"):
        import keras
except ImportError as error:
    # Keras imports its backend on import: on another backend whose dependencies are
    # missing (numpy needs scipy, jax needs jax) it fails before the check below can run.
    raise ImportError(
        f"keras_posenc needs Keras on one of {BACKENDS}, and Keras failed to import: "
        f"{error}. {_BACKEND_HINT}"
    ) from error

if keras.backend.backend() not in BACKENDS:
    raise ImportError(
        f"keras_posenc runs on the Keras backends {BACKENDS}, but Keras is running on "
        f"{keras.backend.backend()!r}. {_BACKEND_HINT}"
    )

from keras_posenc.attention_temperature import (  # noqa: E402
    AttentionTemperature,
    attention_temperature,
)
from keras_posenc.axes import grid_positions, multimodal_positions  # noqa: E402
from keras_posenc.decoder_block import DecoderBlock  # noqa: E402
from keras_posenc.decoder_models import decoder_models  # noqa: E402
from keras_posenc.frequencies import FrequencyTable, inverse_frequencies  # noqa: E402
from keras_posenc.learned import LearnedPositionalEmbedding  # noqa: E402
from keras_posenc.rope_per_layer import rope_per_layer  # noqa: E402
from keras_posenc.rotary import RotaryEmbedding  # noqa: E402
from keras_posenc.rotary_attention import RotaryMultiHeadAttention  # noqa: E402
from keras_posenc.rotary_group_query_attention import RotaryGroupQueryAttention  # noqa: E402
from keras_posenc.sinusoidal import (  # noqa: E402
    SinusoidalInitializer,
    SinusoidalPositionalEncoding,
    sinusoidal_table,
)

__version__ = "0.1.0"

__all__ = [
    "AttentionTemperature",
    "DecoderBlock",
    "FrequencyTable",
    "LearnedPositionalEmbedding",
    "RotaryEmbedding",
    "RotaryGroupQueryAttention",
    "RotaryMultiHeadAttention",
    "SinusoidalInitializer",
    "SinusoidalPositionalEncoding",
    "attention_temperature",
    "decoder_models",
    "grid_positions",
    "inverse_frequencies",
    "multimodal_positions",
    "rope_per_layer",
    "sinusoidal_table",
]
