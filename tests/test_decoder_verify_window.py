"""`save_decoder`'s verification reaches past a sliding window, so a wrong window fails it.

The short cases end at position 72 (a prompt of 8, 64 steps); a real model's window is
wider (Mistral's 4096, Gemma 3's 512 or 1024). With a window below `max_length` the
verification adds a long case: a prompt in one call past the window, then single steps,
batch 2 (one row padded on the left: the window counts tokens, not slots), to the end of
the cache where that is cheap. Here a tiny Mistral with a window of 96 in 128 slots,
exported with the window off by one (one key more or less a query): verification must
refuse the file, and pass it with the right window.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from keras_hub_models import MAX_LENGTH, tiny_causal_lm

from keras_posenc.export import save_decoder
from keras_posenc.export.decoder import check, runtime_version
from keras_posenc.export.decoder import save as save_module
from keras_posenc.export.errors import VerificationError

WINDOW = 96  # past the short cases' 72 positions, inside the 128 slots

pytestmark = pytest.mark.skipif(
    runtime_version._installed() < (1, 32),
    reason="save_decoder refuses windows below onnxruntime 1.32",
)


def _shifted(decoder, by: int):
    """`decoder` with every window `by` wider (a wrong export)."""

    def attention(a):
        return a if a.window is None else dataclasses.replace(a, window=a.window + by)

    blocks = tuple(
        dataclasses.replace(block, attention=attention(block.attention)) for block in decoder.blocks
    )
    return dataclasses.replace(decoder, blocks=blocks)


@pytest.fixture(scope="module")
def causal_lm():
    return tiny_causal_lm("mistral", sliding_window=WINDOW)


@pytest.mark.parametrize("by", [1, -1])
def test_a_window_off_by_one_fails_verification(causal_lm, tmp_path, monkeypatch, by):
    emit = save_module.decoder_onnx
    monkeypatch.setattr(
        save_module,
        "decoder_onnx",
        lambda decoder, attention: emit(_shifted(decoder, by), attention),
    )
    with pytest.raises(VerificationError, match="past the window"):
        save_decoder(causal_lm, tmp_path / "decoder", max_length=MAX_LENGTH)
    assert not (tmp_path / "decoder").exists()


def test_the_right_window_passes_and_is_reached(causal_lm, tmp_path):
    report = save_decoder(causal_lm, tmp_path / "decoder", max_length=MAX_LENGTH)
    assert report["passed"]
    (long,) = [case for case in report["cases"] if "past the window" in case["name"]]
    # The unpadded row's last token sits in the cache's last slot, past the window.
    assert long["last_position"] == MAX_LENGTH - 1 > WINDOW


def test_long_case_only_with_a_window_below_max_length():
    assert len(check.decoder_cases(100, MAX_LENGTH)) == 2
    cases = check.decoder_cases(100, MAX_LENGTH, window=WINDOW)
    prompts, steps = cases[-1]["prompts"], cases[-1]["steps"]
    assert prompts.shape[1] + steps == MAX_LENGTH  # to the end of the cache
    assert (cases[-1]["mask"].sum(axis=1) > WINDOW).all()  # every row's prompt passes it


def test_long_case_stays_near_the_window_in_a_long_cache():
    (*_, long) = check.decoder_cases(100, 32768, window=4096)
    length = long["prompts"].shape[1] + long["steps"]
    assert 4096 < long["mask"].sum(axis=1).min() and length <= 4096 + 64
    assert np.isin(long["mask"], (0, 1)).all()
