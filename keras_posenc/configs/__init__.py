"""Reading transformers configs: the layer arguments a `config.json` describes.

`arguments.rotary_arguments` / `arguments.attention_arguments` read a transformers config
(its object or dict, transformers 4 or 5) into the arguments of `RotaryEmbedding` and the
rotary attention layers, with the defaults each family's config class applies. Every
per-family fact is one record of `families.FAMILIES`, by `model_type`: a new family is one
record there (and, if its config class has code of its own, the function the record names).
The readers take the record, never test a `model_type`.

- `family.py`: the record's shape (`Family`, `Window`, `Norm`), each field documented.
- `families.py`: the records; the refused families and the multimodal wrappers.
- `language_model.py`: a config as a dict, its language model's part, its record, head size.
- `arguments.py`: the entry points; `rope_entries.py`, `axial.py`: the RoPE parameters.
- `schedules.py`: layer types and NoPE layers; `windows.py`, `attention.py`, `norms.py`:
  the attention's window, biases, gate, dropout, refusals and q/k norm.
- `rope_per_layer.py`: one `RotaryEmbedding` (or None) per decoder layer of a config.
"""
