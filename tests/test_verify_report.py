"""The sizes and lines of a verification report (`keras_posenc.export.verify.report`), and
the public questions it asks the layers (`position_tables()`, `stored_arrays`).

Byte counts are worked out here from the table layout (4096 cached rows, 4096 fine and
4096 coarse split rows, float32); rows from `reference.sinusoidal`.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
import reference
from float32_error import U, assert_within_bound

from keras_posenc import LearnedPositionalEmbedding, RotaryEmbedding, SinusoidalPositionalEncoding
from keras_posenc.export.verify import report

WIDTH, CACHE = 8, 4096
F32 = 4


def _model(*layers) -> keras.Model:
    x = keras.Input((None, WIDTH), name="x")
    y = x
    for layer in layers:
        y = layer(y)
    return keras.Model(x, y)


def test_a_layer_lists_its_table_once_built_and_layers_alike_share_it():
    first, second = SinusoidalPositionalEncoding(), SinusoidalPositionalEncoding()
    assert first.position_tables() == ()  # not built
    _model(first, second)
    (table,) = first.position_tables()
    assert second.position_tables()[0] is table
    multi = SinusoidalPositionalEncoding(axes=2)
    multi.build((None, None, WIDTH))
    assert multi.position_tables() == ()


def test_stored_arrays_are_the_rows_of_the_formula_below_the_bound():
    layer = SinusoidalPositionalEncoding()
    _model(layer)
    (table,) = layer.position_tables()
    arrays = table.stored_arrays(5)
    assert list(arrays) == ["cached_0"]
    # The formula rounded once to float32: within u of each entry (a whole ulp off fails).
    exact = reference.sinusoidal(np.arange(5), WIDTH)
    assert_within_bound(arrays["cached_0"], exact, U * np.abs(exact), what="cached_0")
    unbounded = table.stored_arrays()
    assert {name: a.shape for name, a in unbounded.items()} == {
        "cached_0": (CACHE, WIDTH),
        "fine_sin": (CACHE, WIDTH // 2),
        "fine_cos": (CACHE, WIDTH // 2),
        "coarse_sin": (CACHE, WIDTH // 2),
        "coarse_cos": (CACHE, WIDTH // 2),
    }
    coarse = reference.angles(np.arange(3) * CACHE, WIDTH)
    exact = np.sin(coarse)
    assert_within_bound(unbounded["coarse_sin"][:3], exact, U * np.abs(exact), what="coarse_sin")
    assert table.stored_arrays(CACHE + 1)["coarse_cos"].shape == (2, WIDTH // 2)


@pytest.mark.parametrize(
    "bound, expected",
    [
        (100, 100 * WIDTH * F32),
        (CACHE, CACHE * WIDTH * F32),
        (5000, (CACHE * WIDTH + 2 * CACHE * WIDTH // 2 + 2 * 2 * WIDTH // 2) * F32),
        (None, (CACHE * WIDTH + 4 * CACHE * WIDTH // 2) * F32),
    ],
)
def test_position_table_bytes_count_each_table_once_below_the_bound(bound, expected):
    model = _model(SinusoidalPositionalEncoding(), SinusoidalPositionalEncoding())
    assert report.position_table_bytes(model, bound) == expected


def test_a_learned_table_is_a_weight_and_bounds_the_other_tables():
    model = _model(LearnedPositionalEmbedding(10), SinusoidalPositionalEncoding())
    assert report.position_table_bytes(model) == 10 * WIDTH * F32  # sinusoidal rows < 10
    assert report.parameter_bytes(model) == 10 * WIDTH * F32


def test_rotary_rows_are_counted_per_distinct_configuration():
    heads = keras.Input((None, 2, WIDTH), name="heads")
    a = RotaryEmbedding()(heads)
    b = RotaryEmbedding()(a)  # the same table
    c = RotaryEmbedding(max_wavelength=500.0)(b)  # another
    model = keras.Model(heads, c)
    one = report.position_table_bytes(keras.Model(heads, RotaryEmbedding()(heads)), 10)
    assert one > 0
    assert report.position_table_bytes(model, 10) == 2 * one


def test_report_lines_name_the_case_and_say_pass_or_fail():
    case = {"batch": 2, "sequence": 17, "start_index": 4080, "passed": False}
    case["runtimes"] = {"onnxruntime": {"max_abs_error": 0.25, "passed": False}}
    assert report.case_name(case) == "batch 2 x sequence 17 from 4080"
    line = report.progress_line(case, ["onnxruntime"])
    assert line == "batch  2 x sequence   17 from     4080: max abs error 2.5e-01, FAIL"
    full = {"cases": [case], "tolerance": {"atol": 1}, "summary": {"onnxruntime": case}}
    message = report.failure_message("m", full, ["onnxruntime"], None)
    assert "in onnxruntime on 1 of 1 cases (batch 2 x sequence 17 from 4080)" in message
    assert message.endswith("see the error's report")


def test_covered_report_gives_runs_and_runs_per_axis():
    covered = [np.array([0, 1, 2]), np.array([2, 3, 9])]
    axes = {"grid": [[np.array([0, 1]), np.array([5])], [np.array([2]), np.array([6])]]}
    positions = report.covered_report(100, {"grid": "positions"}, covered, axes)
    assert positions == {
        "limit": 100,
        "inputs": {"grid": "positions"},
        "covered": [[0, 3], [9, 9]],
        "covered_per_axis": {"grid": [[[0, 2]], [[5, 6]]]},
    }
