"""Holes the round-three adversarial pass found outside its own files, as failing tests.

Each is `xfail(strict=True)`: it runs, fails today, and turns into a failure of the suite
the day the fix lands (then delete the marker). The reason names the file the fix goes in
(see docs/reliability.md, round three).
"""

from __future__ import annotations

import numpy as np
import pytest

from keras_posenc import RotaryGroupQueryAttention

HEAD_DIM, MAX_LENGTH, WIDTH = 8, 6, 16


@pytest.mark.xfail(
    strict=True,
    reason="_rotary_attention.py: pass the queries' batch to _kv_cache.checked_attention_mask, "
    "which checks steps and max_length only; a batch-3 mask fails inside LogicalAnd",
)
def test_an_attention_mask_of_another_batch_is_an_error_naming_it():
    layer = RotaryGroupQueryAttention(HEAD_DIM, 4, 2)
    x = np.zeros((2, 2, WIDTH), np.float32)
    cache = np.zeros((2, 2, MAX_LENGTH, 2, HEAD_DIM), np.float32)
    with pytest.raises(ValueError, match="attention_mask.*batch 3"):
        layer(x, x, cache=cache, cache_update_index=0, attention_mask=np.ones((3, 2, MAX_LENGTH)))


@pytest.mark.xfail(
    strict=True,
    reason="_rotary_attention.py: ONNX drops the attention_mask assertion of "
    "_kv_cache.checked_attention_mask, and the mask cannot carry NaN; the caller must fold "
    "a validity into its `valid` (as for cache_mask) for a mask of other steps to give NaN",
)
def test_in_onnx_an_attention_mask_of_other_steps_gives_nan(tmp_path):
    import keras
    import onnxruntime

    from keras_posenc import export as kpe

    tokens = keras.Input((None, WIDTH), name="tokens")
    cache = keras.Input((2, MAX_LENGTH, 2, HEAD_DIM), name="cache")
    mask = keras.Input((None, MAX_LENGTH), name="attention_mask")
    layer = RotaryGroupQueryAttention(HEAD_DIM, 4, 2)
    output, _ = layer(tokens, tokens, cache=cache, cache_update_index=0, attention_mask=mask)
    path = kpe.save_onnx(keras.Model([tokens, cache, mask], output), tmp_path / "step.onnx")
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    feeds = {
        "tokens": np.ones((2, 2, WIDTH), np.float32),
        "cache": np.zeros((2, 2, MAX_LENGTH, 2, HEAD_DIM), np.float32),
        "attention_mask": np.ones((2, 1, MAX_LENGTH), np.float32),  # 1 step, not 2
    }
    assert np.isnan(session.run(None, feeds)[0]).all()
