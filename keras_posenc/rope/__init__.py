"""RoPE types: one registry entry per transformers `rope_type`, and what a scaling dict means.

- `registry`: `ROPE_TYPES`, one `RopeType` per type: the keys of its scaling dict, what it
  reads from a transformers config, and the function of its frequencies (transformers'
  `ROPE_INIT_FUNCTIONS`). A new type is one entry there; a type that is not there is
  refused by name.
- `keys`: `checked_scaling`, a user's dict checked against its type's keys.
- `scaling`: `rope_parameters`, the frequencies and attention factor of a checked dict, and
  the rows of the types that switch by total length (`SwitchByLength`, `DynamicRows`).
- `rope_type`: the records, `RopeType` (an entry) and `RopeParameters` (what it computes).
"""

from keras_posenc.rope.keys import check_shared_keys, checked_scaling
from keras_posenc.rope.registry import ROPE_TYPES, find_rope_type
from keras_posenc.rope.rope_type import RopeParameters, RopeType
from keras_posenc.rope.scaling import DynamicRows, SwitchByLength, rope_parameters

__all__ = [
    "ROPE_TYPES",
    "DynamicRows",
    "RopeParameters",
    "RopeType",
    "SwitchByLength",
    "check_shared_keys",
    "checked_scaling",
    "find_rope_type",
    "rope_parameters",
]
