"""`save_decoder`'s LiteRT file: litert-torch's signatures, built-in ops, a float64 decode.

The file must pick the tokens of the float64 numpy decoder of `decoder_reference.py` with
logits within optimum's float32 tolerance (1e-5 + 1e-4·|x|), for a left-padded batch,
where positions counting the padding are off by 1e-3 and more (`test_decoder_save.py`).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from decoder_reference import reference_greedy
from test_decoder_save import MAX_LENGTH, VOCABULARY, step_model

from keras_posenc.export import VerificationError, save_decoder
from keras_posenc.export.decoder import check, decoder_cases, describe_decoder, save
from keras_posenc.export.decoder.litert_decoder import decoder_litert
from keras_posenc.export.decoder.litert_runner import LiteRTDecoder, causal_mask, litert_greedy
from keras_posenc.export.litert import litert_interpreter, litert_ops


@pytest.mark.parametrize(
    "options",
    [{}, {"mlp": "gelu", "rope_layout": "interleaved"}, {"rope_dim": 4, "head_dim": 8}],
    ids=["swiglu-half", "gelu-interleaved", "partial-rotary-head-8"],
)
def test_litert_matches_a_float64_decode(options):
    model = step_model(**options)
    data = decoder_litert(describe_decoder(model, MAX_LENGTH))
    case = decoder_cases(VOCABULARY, MAX_LENGTH)[1]  # batch 4, left-padded
    prompts, mask, steps = case["prompts"], case["mask"], 12
    got = litert_greedy(data, prompts, mask, steps)
    result = check.compare_greedy(reference_greedy(model, prompts, mask, steps), got, mask)
    assert result["passed"], result


@pytest.fixture(scope="module")
def data():
    """The `.tflite` bytes of the default step model."""
    return decoder_litert(describe_decoder(step_model(), MAX_LENGTH))


def test_signatures_are_litert_torchs_with_built_in_ops_only(data):
    ops = litert_ops(data)
    assert not [op for op in ops if op.startswith("Flex") or op == "CUSTOM"], sorted(set(ops))
    # Each signature writes each layer's key and value cache with one update slice.
    assert ops.count("DYNAMIC_UPDATE_SLICE") == 2 * 2 * 2
    interpreter = litert_interpreter(data)
    signatures = interpreter.get_signature_list()
    assert sorted(signatures) == ["decode", "prefill"]
    caches = [f"kv_cache_{kind}_{i}" for i in range(2) for kind in ("k", "v")]
    for name in ("prefill", "decode"):
        assert sorted(signatures[name]["inputs"]) == sorted(
            ["tokens", "input_pos", "mask", *caches]
        )
        assert sorted(signatures[name]["outputs"]) == sorted(["logits", *caches])
    details = interpreter.get_signature_runner("decode").get_input_details()
    assert details["tokens"]["dtype"] == details["input_pos"]["dtype"] == np.int32
    assert list(details["tokens"]["shape_signature"]) == [-1, 1]
    assert list(details["kv_cache_k_0"]["shape_signature"]) == [-1, 2, MAX_LENGTH, 16]
    assert list(details["mask"]["shape_signature"]) == [-1, 1, 1, MAX_LENGTH]


def test_padding_queries_leave_the_cache_finite(data):
    """A padding token attends to no slot; its keys and values must not be NaN."""
    runner = LiteRTDecoder(data, batch=2)
    padding = np.ones((2, MAX_LENGTH), np.int32)
    padding[1, :3] = 0
    logits = runner(np.full((2, 5), 3, np.int32), 0, padding)
    assert np.isfinite(logits[0]).all() and np.isfinite(logits[1, 3:]).all()
    for cache in runner.caches.values():
        assert np.isfinite(cache).all()


@pytest.mark.parametrize(
    ("start", "length", "mask_start"),
    [
        (MAX_LENGTH, 1, MAX_LENGTH),
        (MAX_LENGTH + 5, 1, MAX_LENGTH + 5),
        (-3, 1, -3),
        (MAX_LENGTH - 4, 8, MAX_LENGTH - 4),
        (8, 1, 12),
    ],
    ids=[
        "past-the-end",
        "far-past-the-end",
        "negative",
        "prefill-past-the-end",
        "mask-after-input-pos",
    ],
)
def test_bad_input_pos_gives_nan_and_poisons_the_cache(data, start, length, mask_start):
    """DYNAMIC_UPDATE_SLICE clamps its start: without the guard such a call overwrites the
    last (or first) slot and returns plausible logits. The written slots must be NaN
    (not a finite overwrite of a real key), so every later step of the row is NaN too."""
    runner = LiteRTDecoder(data, batch=1)
    padding = np.ones((1, MAX_LENGTH), np.int32)
    runner(np.arange(1, 9, dtype=np.int32)[None], 0, padding)  # real keys in slots 0..7
    before = runner.caches
    input_pos = np.arange(start, start + length, dtype=np.int32)
    out = runner.runners["decode" if length == 1 else "prefill"](
        tokens=np.full((1, length), 5, np.int32),
        input_pos=input_pos,
        mask=causal_mask(padding, np.arange(mask_start, mask_start + length)),
        **before,
    )
    assert np.isnan(out["logits"]).all()
    for name, cache in before.items():
        changed = ~np.equal(out[name], cache)
        assert np.isnan(out[name][changed]).all(), name  # no finite overwrite
        assert changed.any(), name
    # A later step at slot 9 (not 8: it would overwrite the mask case's NaN slot).
    runner.caches = {name: out[name] for name in before}
    assert np.isnan(runner(np.array([[5]], np.int32), 9, padding)).all()
    runner.caches = before  # the same step from the unpoisoned cache is finite
    assert np.isfinite(runner(np.array([[5]], np.int32), 9, padding)).all()


def test_litert_only_writes_no_onnx(tmp_path):
    """Heads of 8 (GroupQueryAttention refuses them; LiteRT's numbers are checked above)."""
    model = step_model(head_dim=8)
    save_decoder(model, tmp_path / "out", max_length=MAX_LENGTH, formats="litert", verify=False)
    assert {path.name for path in (tmp_path / "out").glob("[!.]*")} == {"model.tflite"}


def test_a_wrong_litert_file_fails_verification(tmp_path, monkeypatch):
    real = save.decoder_litert

    def perturbed(decoder):
        table = decoder.rope.cos.copy()
        table[40] *= 1.01  # one row off, reached at step 33
        rope = type(decoder.rope)(table, decoder.rope.sin, decoder.rope.interleaved)
        return real(type(decoder)(**{**decoder.__dict__, "rope": rope}))

    monkeypatch.setattr(save, "decoder_litert", perturbed)
    with pytest.raises(VerificationError, match=r"litert, batch 1: .*step \d+"):
        save_decoder(
            step_model(), tmp_path / "out", max_length=MAX_LENGTH, formats=("onnx", "litert")
        )
    report = json.loads(save.failed_report_path(tmp_path / "out").read_text())
    assert [case["runtimes"]["onnxruntime"]["passed"] for case in report["cases"]] == [True] * 3


def test_formats_are_checked():
    with pytest.raises(ValueError, match="formats must be"):
        save_decoder(step_model(), "unused", max_length=MAX_LENGTH, formats=("tflite",))
