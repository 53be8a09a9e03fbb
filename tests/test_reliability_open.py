"""Holes the round-three adversarial pass found outside its own files, as failing tests.

Each is `xfail(strict=True)`: it runs, fails today, and turns into a failure of the suite
the day the fix lands (then delete the marker). The reason names the file the fix goes in
(see docs/reliability.md, round three).
"""

from __future__ import annotations

import pytest

from keras_posenc.transformers_config import rotary_arguments

QWEN2_VL = {
    "model_type": "qwen2_vl",
    "hidden_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
}


@pytest.mark.xfail(
    strict=True,
    reason="transformers_config.py: _mrope checks the section's form, not its sum against "
    "the head (known there); the layer refuses it only when built",
)
@pytest.mark.parametrize("section", [[2, 3], [3, 3, 3]])
def test_an_mrope_section_that_does_not_fill_the_head_is_refused_when_read(section):
    # A 16-channel head has 8 pairs; transformers fails in split_with_sizes.
    raw = {**QWEN2_VL, "rope_scaling": {"type": "mrope", "mrope_section": section}}
    with pytest.raises(ValueError, match="mrope_section"):
        rotary_arguments(raw)


@pytest.mark.xfail(
    strict=True,
    reason="transformers_config.py: a null partial_rotary_factor reads as the family default; "
    "transformers refuses the config (KeyError, or phi3's validation)",
)
@pytest.mark.parametrize("model_type", ["phi", "stablelm", "phi3"])
def test_a_null_partial_rotary_factor_is_refused_as_transformers_does(model_type):
    raw = {
        "model_type": model_type,
        "hidden_size": 64,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "partial_rotary_factor": None,
    }
    with pytest.raises(ValueError, match="partial_rotary_factor"):
        rotary_arguments(raw)
