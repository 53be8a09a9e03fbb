"""Reading transformers configs: the layer arguments a `config.json` describes.

`arguments.rotary_arguments` / `arguments.attention_arguments` read a transformers config
(its object or dict, transformers 4 or 5) into the arguments of `RotaryEmbedding` and the
rotary attention layers, with the defaults each family's config class applies. Every
per-family fact is one record of `families.FAMILIES`, by `model_type`: a new family is one
record there (and, if its config class has code of its own, the function the record names).
The other modules read a record, never a `model_type`.
"""
