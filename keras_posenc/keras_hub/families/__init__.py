"""The keras_hub families the bridge reads: one module each, registered here.

Each module builds the `HubFamily` records (`keras_hub/family.py`) of its CausalLM
classes; `REGISTERED` lists them, in the order the refusal of another class names them.
A new family is its module and its import and entry below (and its tests). The lookups
the bridge makes by class name are the functions of this file.
"""

from __future__ import annotations

from keras_posenc.keras_hub import rotary_layers
from keras_posenc.keras_hub.families import (
    gemma,
    gemma4,
    gpt_oss,
    llama,
    mistral,
    phi3,
    qwen,
    smollm3,
)
from keras_posenc.keras_hub.family import HubFamily, RotaryReader

REGISTERED: tuple[HubFamily, ...] = (
    llama.LLAMA,
    llama.LLAMA3,
    mistral.MISTRAL,
    qwen.QWEN2,
    qwen.QWEN3,
    phi3.PHI3,
    gemma.GEMMA,
    gemma.GEMMA3,
    smollm3.SMOLLM3,
    gemma4.GEMMA4,
    gpt_oss.GPT_OSS,
)

_BY_NAME = {name: family for family in REGISTERED for name in (family.causal_lm, *family.aliases)}
_READ_KEYS = {family.backbone: family.read_keys for family in REGISTERED}
_ROTARIES = {kind: reader for family in REGISTERED for kind, reader in family.rotaries.items()}
_GENERIC_ROTARY = RotaryReader(rotary_layers.rotary_embedding_settings, rotary_layers.probe_rows)


def family_named(name: str) -> HubFamily | None:
    """The family of the CausalLM class named `name` (an alias too), or None."""
    return _BY_NAME.get(name)


def read_keys(backbone) -> frozenset[str] | None:
    """The config keys the bridge reads of `backbone` (by its class or a base class), or
    None for a backbone of no family."""
    names = [cls.__name__ for cls in type(backbone).__mro__]
    return next((_READ_KEYS[name] for name in names if name in _READ_KEYS), None)


def _rotary_reader(layer) -> RotaryReader:
    return _ROTARIES.get(type(layer).__name__, _GENERIC_ROTARY)


def rope_settings(layer, owner: str) -> tuple[float, dict | None]:
    """`(max_wavelength, scaling)` of rotary layer `layer` (what a block reader returns),
    scaling in transformers' form (what `keras_posenc.rope` reads), None for none.

    Raises:
        ExportError: a class or a setting the export does not read (named with the layer).
    """
    return _rotary_reader(layer).settings(layer, owner)


def keras_hub_rows(layer, head_dim: int, max_length: int):
    """The rows rotary layer `layer` computes for positions `0..max_length-1`, a `Rope`."""
    reader = _rotary_reader(layer)
    rows = reader.keras_hub_rows or rotary_layers.probe_rows
    return rows(layer, head_dim, max_length)
