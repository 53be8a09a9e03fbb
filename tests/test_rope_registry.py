"""The RoPE registry (`keras_posenc.rope.ROPE_TYPES`): a new type is one entry.

Its keys are checked by `checked_scaling`, its function gives the frequencies, and the
transformers config reader takes what the entry says the type reads; no other code names
the type. (Unknown types: `test_rope_axial_config.py`; each type's numbers:
`test_rope_scaling.py`, `test_rope_types_transformers.py`.)
"""

from __future__ import annotations

import numpy as np
import pytest

from keras_posenc import RotaryEmbedding
from keras_posenc.rope import ROPE_TYPES, RopeParameters, RopeType, rope_parameters

_LLAMA = {
    "model_type": "llama",
    "hidden_size": 64,
    "num_attention_heads": 4,
    "max_position_embeddings": 4096,
    "rope_theta": 1e4,
}


def test_a_new_rope_type_is_one_registry_entry(monkeypatch):
    # The entry's keys are checked, its function gives the frequencies, and the config
    # reader takes what the entry says it reads: nothing else names the type.
    seen = []

    def thirds(omega, rotary_dim, max_wavelength, scaling):
        seen.append(scaling)
        return RopeParameters(omega / scaling["factor"])

    entry = RopeType(
        thirds,
        required=("factor",),
        optional=("original_max_position_embeddings",),
        needs_original_length=True,
    )
    monkeypatch.setitem(ROPE_TYPES, "made_up", entry)
    plain = rope_parameters(16, 1e4, None).inverse_frequencies
    made_up = rope_parameters(16, 1e4, {"rope_type": "made_up", "factor": 3.0})
    np.testing.assert_array_equal(made_up.inverse_frequencies, plain / 3.0)
    with pytest.raises(ValueError, match=r"missing \['factor'\]"):
        rope_parameters(16, 1e4, {"rope_type": "made_up"})
    config = {**_LLAMA, "rope_scaling": {"rope_type": "made_up", "factor": 3.0}}
    layer = RotaryEmbedding.from_transformers_config(config)
    layer.build((1, 2, 4, 16))
    np.testing.assert_array_equal(layer.inverse_frequencies(), plain / 3.0)
    assert seen[-1]["original_max_position_embeddings"] == 4096  # needs_original_length
