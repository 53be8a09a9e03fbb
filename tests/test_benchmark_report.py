"""The benchmark's statistics and its floors (its timings are not tests: see benchmarks/)."""

from __future__ import annotations

import numpy as np
import pytest
import reference
import tensorflow as tf
from float32_error import assert_within_bound, rotation_error

from benchmarks.candidates import Case, compiled, rotary_forms
from benchmarks.report import _ratio, misses, sign_test, write_whole
from benchmarks.timing import Timed


@pytest.mark.parametrize(
    ("successes", "trials", "p"),
    [
        (0, 10, 2 / 1024),  # all ten rounds one way: 2 * (1/2)^10
        (10, 10, 2 / 1024),
        (2, 10, 2 * (1 + 10 + 45) / 1024),
        (5, 10, 1.0),  # an even split is no evidence at all
        (20, 40, 1.0),
    ],
)
def test_sign_test_matches_the_binomial_tails(successes, trials, p):
    assert sign_test(successes, trials) == pytest.approx(p, rel=1e-12)


@pytest.mark.parametrize("mode", ["eager", "function", "xla"])
@pytest.mark.parametrize("shape", [(2, 5, 3, 8), (1, 6, 16)])
def test_every_rotary_floor_form_rotates_like_the_reference(mode, shape):
    x = np.random.default_rng(1).uniform(-1, 1, shape).astype(np.float32)
    positions = np.arange(3, 3 + shape[1])
    expected = reference.rotary(x, positions)
    case = Case("rotary", shape, 3, True, mode)
    forms = rotary_forms(shape, positions)
    assert set(forms) == {"roll", "concat", "reverse", "gather", "halves"}
    for name, body in forms.items():
        out = compiled(body, case, tf.constant(x))().numpy()
        assert_within_bound(out, expected, rotation_error(x), what=name)


def _row(ours_ms, floor_ms, hub_ms, mode="xla", past_cache=False, error=1e-8):
    def timed(samples):
        return Timed(lambda: None, samples=[s / 1e3 for s in samples])

    def ratio(a, b):
        return _ratio(timed(a), timed(b))

    return {
        "layer": "rotary",
        "shape": [8, 512, 8, 64],
        "start": "int 0",
        "mode": mode,
        "past_cache": past_cache,
        "results": {"ours": {"max_abs_error": error}},
        "ratios": {
            "ours/floor": ratio(ours_ms, floor_ms),
            "control/floor": ratio(floor_ms, floor_ms),
            "keras_hub/ours": ratio(hub_ms, ours_ms),
        },
    }


def test_misses_name_the_rows_off_the_floor_or_behind_keras_hub_with_their_sign_test():
    slow = _row([1.5, 1.6, 1.4, 1.5], [1.0, 1.0, 1.1, 0.9], [1.2, 1.3, 1.2, 1.6])
    fine = _row([1.0, 1.1, 1.0, 1.0], [1.0, 1.0, 1.0, 1.0], [2.0, 2.0, 2.0, 2.0])
    eager = _row([3.0] * 4, [1.0] * 4, [4.0] * 4, mode="eager")  # not held to the floor
    past = _row([3.0] * 4, [1.0] * 4, [4.0] * 4, past_cache=True)
    wrong = _row([1.0] * 4, [1.0] * 4, [1.0] * 4, error=1e-3)
    found = misses([slow, fine, eager, past, wrong])
    assert len(found["floor"]) == 1 and "ours/floor 1.50" in found["floor"][0]
    assert "ours faster in 0 of 4 rounds, sign test p = 0.12" in found["floor"][0]
    assert len(found["keras_hub"]) == 1 and "keras_hub/ours 0.83" in found["keras_hub"][0]
    assert found["precision"] == ["rotary 8x512x8x64 int 0 xla: 0.001"]


def test_write_whole_replaces_the_file_and_leaves_nothing_else(tmp_path):
    target = tmp_path / "docs" / "benchmarks.md"
    write_whole(target, "old\n")
    write_whole(target, "new\n")
    assert target.read_text() == "new\n"
    assert [p.name for p in target.parent.iterdir()] == ["benchmarks.md"]
