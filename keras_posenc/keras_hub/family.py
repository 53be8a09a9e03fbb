"""The protocol of a keras_hub family: what the bridge needs to know of one CausalLM class.

A family's module (in `families/`) builds one `HubFamily` per CausalLM class it reads
and `families/__init__.py` lists it; nothing else in the bridge names a family. The
readers of parts several families share are beside this file: `llama_style.py` (the
Llama-style block, in any spelling), `layer_readers.py` (arrays, RMSNorms),
`rotary_layers.py` (keras_hub's `RotaryEmbedding`, the tables), `kv_caches.py` (the
layouts of keras_hub's caches); `private.py` reads every private attribute of keras_hub.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping

from keras_posenc.export.decoder.description import Block, PerLayerInputs, Rope
from keras_posenc.keras_hub import kv_caches

# `read_block(transformer layer, max_length, owner) -> (Block, its rotary layer or None)`:
# None for a layer without RoPE (a NoPE layer).
BlockReader = Callable[[object, int, str], tuple[Block, object]]


def _traceable(causal_lm) -> bool:
    return False


@dataclasses.dataclass(frozen=True)
class RotaryReader:
    """How the bridge reads a rotary layer class of keras_hub (or a family's wrapper of one).

    Attributes:
        settings: `settings(layer, owner) -> (max_wavelength, scaling)`, the scaling in
            transformers' form (what `keras_posenc.rope` reads) or None; raises
            an `ExportError` naming a setting the export cannot write.
        keras_hub_rows: `keras_hub_rows(layer, head_dim, max_length) -> Rope`, the rows
            the layer itself computes; None: `rotary_layers.probe_rows` (rotating a
            probe vector, which any layer that rotates halves answers).
    """

    settings: Callable[[object, str], tuple[float, dict | None]]
    keras_hub_rows: Callable[[object, int, int], Rope] | None = None


@dataclasses.dataclass(frozen=True)
class HubFamily:
    """One keras_hub CausalLM class as the bridge reads it.

    Attributes:
        causal_lm: the CausalLM's class name (`"LlamaCausalLM"`); a class of that name
            from a `keras_hub.` module is read by this family.
        backbone: its backbone's class name (`"LlamaBackbone"`), a subclass's too.
        read_block: reads one of `backbone.transformer_layers` (see `BlockReader`).
        read_keys: the keys of the backbone's config the readers read (besides those
            every backbone has): any other key set to a value other than its default
            is refused, naming it (`backbone_settings.py`).
        norms: the class names of its own RMSNorms (`layer_readers.rms_norm`), its
            final norm's among them; Keras's and Gemma's `RMSNormalization` are read
            in any family.
        aliases: other names keras_hub gives the same class (`"Qwen2CausalLM"`).
        rotaries: `{rotary layer class name: RotaryReader}` of the rotary layers its
            blocks return other than keras_hub's `RotaryEmbedding` (read by
            `rotary_layers.rotary_embedding_settings`).
        embedding_scaled: whether the embedded tokens are multiplied by
            `sqrt(hidden_dim)` in float32 (Gemma's).
        per_layer_inputs: `per_layer_inputs(backbone, owner)`, the per-layer embeddings
            (Gemma 4's) or None; None: the family has none.
        empty_cache: `empty_cache(causal_lm, batch, slots)`, keras_hub's empty cache
            for `call_with_cache` (`kv_caches.py`).
        eager_reference: `eager_reference(causal_lm)`, whether keras_hub's
            `call_with_cache` cannot be traced for this model (it tests a tensor's truth
            in Python), so the reference generation runs it eagerly.
    """

    causal_lm: str
    backbone: str
    read_block: BlockReader
    read_keys: frozenset[str]
    norms: tuple[str, ...] = ()
    aliases: tuple[str, ...] = ()
    rotaries: Mapping[str, RotaryReader] = dataclasses.field(default_factory=dict)
    embedding_scaled: bool = False
    per_layer_inputs: Callable[[object, str], PerLayerInputs | None] | None = None
    empty_cache: Callable[[object, int, int], object] = kv_caches.stacked_cache
    eager_reference: Callable[[object], bool] = _traceable
