"""The sweep of `tests/sweep.py`: no input gives a wrong answer or an error not of the package."""

from __future__ import annotations

import pytest
import sweep


@pytest.mark.parametrize("mode", sweep.MODES)
def test_every_drawn_case_is_right_a_clear_error_or_nan(mode):
    result = sweep.sweep(examples=30, modes=(mode,))
    assert not result["failures"], result["failures"][:3]
    outcomes = sum(result["counts"].values(), start=__import__("collections").Counter())
    # The sweep reaches both sides: valid cases computed right and invalid ones refused.
    assert outcomes["right"] > 0 and outcomes["error"] + outcomes["nan"] > 0
