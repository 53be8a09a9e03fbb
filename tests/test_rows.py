"""Which rows serve a run or some positions (`keras_posenc.tables.rows`), on a table of counting
rows.

Row `i` of the table is `(i, -i)`: the expected rows are written down from the positions
alone, whichever source (a slice of the ready rows, computed rows, host rows) served them.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from keras_posenc.backend import tensorflow as tf_backend
from keras_posenc.tables.rows import TableRows

READY, LIMIT = 4, 64


def _counting(positions) -> np.ndarray:
    positions = np.asarray(positions, np.float32)
    return np.stack([positions, -positions], -1)


class CountingRows(TableRows):
    """Rows `(i, -i)`: the first `READY` ready, any other below `LIMIT` computed."""

    limit = LIMIT

    def __init__(self):
        super().__init__([tf_backend.HostConstant(_counting(np.arange(READY)))])
        self.computed_calls = 0

    def computed(self, positions, below):
        self.computed_calls += 1
        position = tf.cast(positions, tf.float32)
        return (tf.stack([position, -position], -1),)

    def host_run(self, start, length):
        self.computed_calls += 1
        return (tf.constant(_counting(np.arange(start, start + length))),)


class FixedRows(TableRows):
    """The counting rows of `READY` positions and no others (as a learned table)."""

    def __init__(self):
        super().__init__([tf.constant(_counting(np.arange(READY)))])


def _run(table, start, length, mode):
    if mode == "eager":
        (rows,) = table.slice(start, length)
        return rows.numpy()
    function = tf.function(lambda s: table.slice(s, length)[0], jit_compile=mode == "xla")
    return function(tf.constant(start)).numpy()


@pytest.mark.parametrize("mode", ["eager", "function", "xla"])
@pytest.mark.parametrize(("start", "length"), [(0, 4), (1, 2), (2, 5), (3, 1), (60, 4)])
def test_a_run_gets_its_own_rows_from_a_run_time_start(mode, start, length):
    rows = _run(CountingRows(), start, length, mode)
    np.testing.assert_array_equal(rows, _counting(np.arange(start, start + length)))


def test_a_known_run_within_the_ready_rows_is_a_slice_of_them():
    table = CountingRows()
    tf.function(lambda: table.slice(1, 3)).get_concrete_function()
    assert table.computed_calls == 0
    tf.function(lambda: table.slice(2, 3)).get_concrete_function()
    assert table.computed_calls == 1  # past the ready rows: the host rows of that run


def test_a_run_past_an_export_s_bound_gives_nan_rows_where_assertions_are_dropped():
    table = CountingRows()
    # XLA drops the assertions (as converters do) and TensorFlow then runs the graph.
    with tf_backend.positions_bounded(3):
        function = tf.function(
            lambda s: table.slice(s, 2)[0], jit_compile=True
        ).get_concrete_function(tf.TensorSpec((), tf.int32))
    np.testing.assert_array_equal(function(tf.constant(1)).numpy(), _counting([1, 2]))
    past = function(tf.constant(2)).numpy()
    assert past.shape == (2, 2) and np.isnan(past).all()


def test_a_run_past_an_export_s_bound_raises_where_assertions_run():
    table = CountingRows()
    with tf_backend.positions_bounded(3):
        function = tf.function(lambda s: table.slice(s, 2)[0]).get_concrete_function(
            tf.TensorSpec((), tf.int32)
        )
    with pytest.raises(tf.errors.InvalidArgumentError, match="exported for positions below 3"):
        function(tf.constant(2))


@pytest.mark.parametrize("length_known", [True, False], ids=["static length", "length tensor"])
def test_a_run_past_a_fixed_table_still_gives_one_row_per_step_for_its_caller_to_poison(
    length_known,
):
    table = FixedRows()

    def run(start, length):
        return table.slice(start, 3 if length_known else length)[0]

    with tf_backend.tracing_for_a_converter():
        function = tf.function(run).get_concrete_function(
            tf.TensorSpec((), tf.int32), tf.TensorSpec((), tf.int32)
        )
    np.testing.assert_array_equal(function(tf.constant(1), tf.constant(3)), _counting([1, 2, 3]))
    assert function(tf.constant(3), tf.constant(3)).shape == (3, 2)


def test_positions_past_an_export_s_bound_give_nan_rows_and_others_their_own():
    table = CountingRows()
    positions = tf.TensorSpec((None,), tf.int32)
    with tf_backend.positions_bounded(6):
        function = tf.function(
            lambda p: table.gather(p)[0], jit_compile=True
        ).get_concrete_function(positions)
    np.testing.assert_array_equal(function(tf.constant([5, 0, 2])), _counting([5, 0, 2]))
    assert np.isnan(function(tf.constant([1, 6])).numpy()).all()
    np.testing.assert_array_equal(table.gather(tf.constant([9, 63]))[0], _counting([9, 63]))
