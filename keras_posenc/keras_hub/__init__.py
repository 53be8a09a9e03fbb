"""keras_hub's CausalLMs through `keras_posenc.export.save_decoder` (an optional extra).

`describe_causal_lm(causal_lm, max_length)` reads a keras_hub CausalLM's backbone into
the same `Decoder` the package's own step models become, so one emitter writes both;
`keras_hub_greedy(causal_lm)` is the reference the export is verified against: keras_hub's
own `call_with_cache`, generating as its `generate()` does; `rebuild(causal_lm,
max_length)` the same model made of the package's layers, where they express it.
Importing this module does not import keras_hub (the classes are recognised by name and
read by their attributes).
"""

from keras_posenc.keras_hub.describe import (
    ALIASES,
    FAMILIES,
    describe_causal_lm,
    is_keras_hub_causal_lm,
)
from keras_posenc.keras_hub.greedy import keras_hub_greedy
from keras_posenc.keras_hub.rebuild import rebuild

__all__ = [
    "ALIASES",
    "FAMILIES",
    "describe_causal_lm",
    "is_keras_hub_causal_lm",
    "keras_hub_greedy",
    "rebuild",
]
