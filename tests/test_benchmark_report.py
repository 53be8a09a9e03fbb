"""The benchmark's statistics (its timings are not tests: see benchmarks/)."""

from __future__ import annotations

import pytest

from benchmarks.report import sign_test


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
