"""The float64 judge at a real size: no runtime open while it runs, said on stderr,
its decode and distances computed in blocks (issue 39, docs/real_size.md).

At 1B and max_length 1024, `save_decoder`'s teacher-forced case failed against
keras_hub's float32 logits (its RoPE angles) and was judged by the float64 decode of the
description (`judge.py`, `exact.py`): the judge ran while onnxruntime's session was open
(each holding a copy of the weights), its layers said as `write model.onnx: layer i of
n`, and its head and distances were whole float64 copies of tables of 128256 columns.

Here a tiny keras_hub Llama's reference is moved by a constant per row growing with the
position, to 3 tolerances at the last one (the argmax unchanged, as keras_hub's angles
move it), so every runtime fails the teacher-forced case against it and is judged.
"""

from __future__ import annotations

import re
import weakref

import numpy as np
import pytest
from keras_hub_models import GENAI, tiny_causal_lm

from keras_posenc import keras_hub as bridge
from keras_posenc.export import save_decoder
from keras_posenc.export.decoder import check, exact, judge, save
from keras_posenc.export.decoder.logit_tolerance import bound, compared, positions

MAX_LENGTH = 48
DRIFT = 3.0  # tolerances at the last position: past 1, within judge.REFERENCE_SLACK


def _drifting(greedy):
    """`greedy` with each logit row moved by `DRIFT · position / (MAX_LENGTH - 1)` of its
    own tolerance."""

    def moved(prompts, mask, steps):
        tokens, logits = greedy(prompts, mask, steps)
        share = [DRIFT * np.maximum(p, 0) / (MAX_LENGTH - 1) for p in positions(mask, steps)]
        first = [logits[0] + (bound(logits[0]) * share[0][..., None]).astype(np.float32)]
        rest = [
            x + (bound(x) * s[:, None]).astype(np.float32)
            for x, s in zip(logits[1:], share[1:], strict=True)
        ]
        return tokens, first + rest

    return moved


@pytest.fixture()
def drifting_keras_hub(monkeypatch):
    real = bridge.keras_hub_greedy
    monkeypatch.setattr(bridge, "keras_hub_greedy", lambda lm: _drifting(real(lm)))
    return tiny_causal_lm("llama")


def _judged(report: dict) -> list[str]:
    return [
        name
        for case in report["cases"]
        for name, result in case["runtimes"].items()
        if "float64" in result
    ]


def test_the_judge_runs_with_no_runtime_open(drifting_keras_hub, monkeypatch, tmp_path):
    """Each runtime holds a copy of the weights: the float64 decode (and the description
    made again for it) comes after every runtime has run and been released."""
    events = []

    def tracked(name, open_runtime):
        def opened(*args, **kwargs):
            greedy = open_runtime(*args, **kwargs)
            events.append(f"open {name}")
            weakref.finalize(greedy, events.append, f"released {name}")
            return greedy

        return opened

    monkeypatch.setattr(save, "_onnx_runtime", tracked("onnxruntime", save._onnx_runtime))
    monkeypatch.setattr(save, "genai_greedy", tracked("onnxruntime-genai", save.genai_greedy))
    real_exact = exact.exact_greedy

    def exact_greedy(*args, **kwargs):
        events.append("float64 decode")
        return real_exact(*args, **kwargs)

    monkeypatch.setattr(exact, "exact_greedy", exact_greedy)
    report = save_decoder(drifting_keras_hub, tmp_path / "out", max_length=MAX_LENGTH, verbose=0)
    assert report["passed"], check.failure_message(report)
    assert set(_judged(report)) == {"onnxruntime", *GENAI}
    assert "float64 decode" in events, events
    for i, event in enumerate(events):
        if event == "float64 decode":
            before = events[:i]
            opened = sum(e.startswith("open") for e in before)
            assert opened == sum(e.startswith("released") for e in before), events


def test_the_judge_says_what_it_is_doing(drifting_keras_hub, tmp_path, capsys):
    """The description made again for the float64 decode says its layers under its own
    name, not under the phase before it (`write model.onnx: layer i of n`)."""
    report = save_decoder(drifting_keras_hub, tmp_path / "out", max_length=MAX_LENGTH)
    assert report["passed"] and _judged(report)
    err = capsys.readouterr().err
    verifying = err.index("verifying case 1")
    assert not re.search(r"write model\.onnx: layer", err[verifying:]), err
    judging = re.search(r": ([^\n:]*float64[^\n:]*): layer 2 of 2\n", err[verifying:])
    assert judging, err
    assert "describ" in judging[1], err
    last_case = [m.start() for m in re.finditer(r"verifying case \d+ of \d+: ", err)][-1]
    assert verifying + judging.start() > last_case, err  # after every runtime's cases


def _whole_table_logits(decoder, tokens) -> tuple[np.ndarray, np.ndarray]:
    """The float64 logits of one row with the head as one float64 copy (what the decode
    computed before its head was read in blocks), and how far another float64
    evaluation of the same sums can be from them.

    BLAS picks its kernel by the shape of a product, so a block of columns is summed in
    another order than the whole table: each of the two is within `γ_n |h|·|W|` of the
    exact product (`γ_n = n u / (1 - n u)`, `u = 2^-53`, float64's forward error bound
    of a dot product of length n: tests/float32_error.py), so they are within twice
    that of each other; the bias and the soft cap (slope at most 1) add a rounding or
    two of the result."""
    hidden, _, _ = exact.exact_hidden(decoder, tokens)
    head = np.float64(decoder.head)
    logits = hidden @ head
    if decoder.head_bias is not None:
        logits = logits + np.float64(decoder.head_bias)
    cap = decoder.final_softcap
    logits = cap * np.tanh(logits / cap) if cap else logits
    u = 2.0**-53
    n = head.shape[0]
    allowed = 2 * (n * u / (1 - n * u)) * (np.abs(hidden) @ np.abs(head)) + 4 * u * np.abs(logits)
    return logits, allowed


@pytest.mark.parametrize("family", ["llama", "gemma2"])  # tied; a final soft cap
def test_the_float64_head_in_blocks_is_the_whole_tables(family, monkeypatch):
    causal_lm = tiny_causal_lm(family)
    decoder = bridge.describe_causal_lm(causal_lm, MAX_LENGTH)
    case = check.teacher_forced_case(decoder.vocabulary, MAX_LENGTH)
    tokens = case["prompts"][0]
    whole, allowed = _whole_table_logits(decoder, tokens)
    monkeypatch.setattr(exact, "HEAD_BLOCK", 7 * decoder.head.shape[0])  # 7 columns a block
    blocked = exact.exact_row(decoder, tokens)[0]
    assert np.all(np.abs(blocked - whole) <= allowed), np.max(np.abs(blocked - whole) / allowed)
    got, _ = exact.exact_greedy(decoder, case["prompts"], case["mask"], np.zeros((1, 1), int))
    np.testing.assert_array_equal(got[0][0], blocked)  # the same blocks, into the layout


def test_the_distances_in_blocks_are_the_whole_arrays(monkeypatch):
    rng = np.random.default_rng(0)
    mask = np.ones((2, 30), np.int64)
    mask[1, :4] = 0
    steps, vocabulary = 3, 50
    want = [rng.normal(size=(2, 30, vocabulary))] + [rng.normal(size=(2, vocabulary))] * steps
    got = [(x + 1e-4 * rng.normal(size=x.shape)).astype(np.float32) for x in want]
    ref = [(x + 3e-4 * rng.normal(size=x.shape)).astype(np.float32) for x in want]
    selected = compared(mask, steps)
    distances = []
    for logits in (got, ref):
        rows = zip(logits, want, selected, strict=True)
        errors = [np.abs(np.float64(x)[r] - w[r]) for x, w, r in rows]
        scaled = [e / bound(w[r]) for e, w, r in zip(errors, want, selected, strict=True)]
        distances.append((max(e.max() for e in errors), max(s.max() for s in scaled)))
    monkeypatch.setattr(judge, "BLOCK_LOGITS", 3 * vocabulary)  # 3 rows a block
    verdict = judge.against_float64((None, ref), (None, got), want, mask, steps)
    for side, (largest, tolerances) in zip(("file", "reference"), distances, strict=True):
        assert verdict[side]["max_abs_error"] == largest
        assert verdict[side]["tolerances"] == tolerances
