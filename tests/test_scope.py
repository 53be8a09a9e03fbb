"""The rotation scope (`keras_posenc.layers.rotation_scope`): what the layer writes is what the
pass reads."""

from __future__ import annotations

import itertools

import pytest

from keras_posenc.layers.rotation_scope import RotationScope, read_rotation_scope, rotation_scope


@pytest.mark.parametrize(
    "layout, rank, sequence_axis, feature_axis, per_batch",
    list(itertools.product(["half", "interleaved"], [3, 4], [1, 2], [2, 3], [False, True])),
)
def test_a_scope_reads_back_as_it_was_written(layout, rank, sequence_axis, feature_axis, per_batch):
    scope = rotation_scope(layout, rank, sequence_axis, feature_axis, per_batch)
    for suffix in ("", "_1", "_12"):  # TensorFlow's suffix for a scope entered again
        prefix = f"model/rotary_embedding/{scope}{suffix}/"
        assert read_rotation_scope(prefix + "mul_1") == RotationScope(
            layout, rank, sequence_axis, feature_axis, per_batch, prefix
        )


def test_names_outside_a_scope_read_as_none():
    scope = rotation_scope("half", 4, 1, 3, False)
    for name in (
        "model/dense/MatMul",
        scope,
        f"a/{scope}x/mul",
        "a/posenc_rotation_odd_r4_s1_f3_b0/",
    ):
        assert read_rotation_scope(name) is None
