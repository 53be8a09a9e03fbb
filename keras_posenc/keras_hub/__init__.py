"""The keras_hub bridge: keras_hub's CausalLMs through `keras_posenc.export.save_decoder`.

`describe_causal_lm(causal_lm, max_length)` reads a keras_hub CausalLM's backbone into
the same `Decoder` the package's own step models become, so one emitter writes both;
`keras_hub_greedy(causal_lm)` is the reference the export is verified against: keras_hub's
own `call_with_cache`, generating as its `generate()` does; `rebuild(causal_lm,
max_length)` the same model made of the package's layers, where they express it.
Importing this module does not import keras_hub (the classes are recognised by name and
read by their attributes).

The folder: `family.py` is the protocol a family implements (`HubFamily`); `families/`
holds one module per family and registers them (a new family is its module and one line
there); `backbone_reader.py` reads a CausalLM through its family, `reference_generation.py`
generates with keras_hub, `rebuild_decoder.py` rebuilds; the parts families share are
`llama_style.py`, `layer_readers.py`, `rotary_layers.py` and `kv_caches.py`, the settings
a backbone may hold `backbone_settings.py`, and every private attribute of keras_hub the
bridge reads is in `private.py`.
"""

from keras_posenc.keras_hub.backbone_reader import (
    ALIASES,
    FAMILIES,
    describe_causal_lm,
    is_keras_hub_causal_lm,
)
from keras_posenc.keras_hub.rebuild_decoder import rebuild
from keras_posenc.keras_hub.reference_generation import keras_hub_greedy

__all__ = [
    "ALIASES",
    "FAMILIES",
    "describe_causal_lm",
    "is_keras_hub_causal_lm",
    "keras_hub_greedy",
    "rebuild",
]
