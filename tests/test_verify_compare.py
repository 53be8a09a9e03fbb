"""How outputs are compared (`keras_posenc.export.verify.compare`), against `np.allclose`."""

from __future__ import annotations

import numpy as np
import pytest

from keras_posenc.export.verify import compare

TOLERANCE = {"atol": 1e-5, "rtol": 1e-4}


@pytest.mark.parametrize("scale", [1e-7, 1e-5, 1e-3])
def test_compare_outputs_passes_exactly_when_allclose_does(scale):
    rng = np.random.default_rng(int(1 / scale))
    expected = rng.standard_normal((3, 7)).astype(np.float32)
    actual = expected + np.float32(scale) * rng.standard_normal(expected.shape).astype("f4")
    result = compare.compare_outputs({"y": actual}, {"y": expected}, TOLERANCE)
    difference = np.abs(actual.astype(np.float64) - expected)
    assert result["passed"] == bool(np.allclose(actual, expected, **TOLERANCE))
    assert result["max_abs_error"] == pytest.approx(difference.max(), rel=1e-12)
    assert result["max_rel_error"] == pytest.approx((difference / np.abs(expected)).max())
    used = difference / (1e-5 + 1e-4 * np.abs(expected.astype(np.float64)))
    assert result["tolerance_used"] == pytest.approx(used.max())


def test_a_missing_output_fails_with_its_name():
    result = compare.compare_outputs({}, {"y": np.zeros(2)}, TOLERANCE)
    assert not result["passed"] and result["problems"] == ["output 'y' is missing"]


def test_a_failed_runtime_is_unbounded_and_the_summary_takes_the_worst_case():
    failed = compare.runtime_failure("RuntimeError: no")
    assert failed["passed"] is False and failed["max_abs_error"] == float("inf")
    ok = {"max_abs_error": 1e-6, "max_rel_error": 1e-5, "tolerance_used": 0.1, "passed": True}
    cases = [{"runtimes": {"keras": {}, "onnxruntime": ok}}]
    cases.append({"runtimes": {"keras": {}, "onnxruntime": failed}})
    summary = compare.summarize(cases, ["keras", "onnxruntime"], ["onnxruntime"])
    assert summary["keras"] == {"reference": True}
    assert summary["onnxruntime"] == {
        "max_abs_error": float("inf"),
        "max_rel_error": float("inf"),
        "tolerance_used": float("inf"),
        "passed": False,
    }
    assert compare.summarize(cases[:1], ["onnxruntime"], ["onnxruntime"])["onnxruntime"] == ok
