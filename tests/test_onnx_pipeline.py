"""The pipeline (`onnx_passes`: `PASSES`, `optimized`): every pass, in order, on an export.

An encoder with the exact gelu (an `Erfc` tf2onnx leaves) and RoPE attention goes through
all the passes at each rotary option and matches Keras; the order of `PASSES` is the one
its reasons give; and nothing under `onnx_passes` imports TensorFlow, Keras or a layer.
"""

from __future__ import annotations

import ast
import copy
import functools
from pathlib import Path

import hand_built
import keras
import numpy as np
import onnx
import pytest

from keras_posenc import RotaryMultiHeadAttention, export
from keras_posenc.export import onnx_passes

TOLERANCE = 1e-5

_session = hand_built.session


def _tf2onnx_proto(model: keras.Model) -> onnx.ModelProto:
    # export.onnx_model refuses a graph with Erfc; convert the way it does, without the check.
    import tf2onnx

    proto, _ = tf2onnx.convert.from_function(
        export.serving_function(model), input_signature=export.input_signature(model), opset=17
    )
    return proto


@functools.cache
def _gelu_encoder() -> tuple[keras.Model, onnx.ModelProto]:
    x = keras.Input((None, 16), name="x")
    h = keras.layers.LayerNormalization()(x)
    h = x + RotaryMultiHeadAttention(num_heads=2, key_dim=8)(h, h)
    h = h + keras.layers.Dense(16)(keras.layers.Dense(32, activation="gelu")(h))
    model = keras.Model(x, h)
    return model, _tf2onnx_proto(model)


@pytest.mark.parametrize(
    "rotary, opset, kernel",
    [
        ("fused", None, "com.microsoft:RotaryEmbedding"),
        ("fused", 23, "RotaryEmbedding"),
        ("decomposed", None, None),
    ],
)
def test_exact_gelu_encoder_exports_and_matches_keras(rotary, opset, kernel):
    model, converted = _gelu_encoder()
    assert onnx_passes.op_counts(converted).get("Erfc", 0) == 1
    proto = onnx_passes.optimized(copy.deepcopy(converted), rotary=rotary, opset=opset)
    counts = onnx_passes.op_counts(proto)
    assert "Erfc" not in counts and counts["Erf"] == 1
    if kernel:
        assert counts[kernel] == 2, counts
    else:
        assert not {"RotaryEmbedding", "com.microsoft:RotaryEmbedding"} & set(counts)
    session = _session(proto)
    rng = np.random.default_rng(0)
    for batch, length in [(1, 1), (2, 7), (3, 33)]:
        # Wide inputs reach gelu's tails, where 1 - erf(x) rounds to 0 or 2.
        value = (8 * rng.standard_normal((batch, length, 16))).astype(np.float32)
        (actual,) = session.run(None, {"x": value})
        np.testing.assert_allclose(actual, np.asarray(model(value)), rtol=1e-5, atol=TOLERANCE)


def test_optimized_rejects_an_unknown_rotary_option():
    _, converted = _gelu_encoder()
    with pytest.raises(ValueError, match="'fused' or 'decomposed'"):
        onnx_passes.optimized(copy.deepcopy(converted), rotary="standard")


def test_the_passes_stand_in_the_order_their_reasons_give():
    names = [p.name for p in onnx_passes.PASSES]
    assert names == [
        "erfc",
        "extra",
        "check",
        "constants",
        "opset",
        "rotary",
        "reshape_sizes",
        "cse",
        "guards",
        "cse_after_guards",
        "dynamic_axes",
    ]
    assert all(p.reason for p in onnx_passes.PASSES)
    every_conversion = [p.name for p in onnx_passes.PASSES if not p.optimizes]
    assert every_conversion == ["erfc", "extra", "check", "constants", "dynamic_axes"]


def test_onnx_model_runs_the_pipeline_and_checks_once(monkeypatch):
    model, _ = _gelu_encoder()
    ran, checked = [], []
    real_run, real_check = onnx_passes.run_passes, onnx.checker.check_model
    monkeypatch.setattr(
        onnx_passes, "run_passes", lambda *a, **k: ran.append(1) or real_run(*a, **k)
    )
    monkeypatch.setattr(
        onnx.checker, "check_model", lambda *a, **k: checked.append(1) or real_check(*a, **k)
    )
    for rotary in ("fused", None):
        ran.clear(), checked.clear()
        export.onnx_model(model, rotary=rotary)
        assert (len(ran), len(checked)) == (1, 1), rotary


def test_the_callers_passes_run_before_the_check_and_may_return_a_new_proto():
    model, _ = _gelu_encoder()
    seen = []

    def documented(proto: onnx.ModelProto) -> onnx.ModelProto:
        seen.append(onnx_passes.op_counts(proto).get("Erfc", 0))
        new = copy.deepcopy(proto)
        new.doc_string = "rewritten by the caller"
        return new

    proto = export.onnx_model(model, rotary=None, passes=[documented])
    assert seen == [0]  # after erfc
    assert proto.doc_string == "rewritten by the caller"

    def unknown_op(proto: onnx.ModelProto) -> None:
        proto.graph.node[0].op_type = "NotAnOnnxOp"

    with pytest.raises(export.ExportError, match="NotAnOnnxOp"):
        export.onnx_model(model, passes=[unknown_op])


def test_run_passes_returns_each_pass_s_count():
    _, converted = _gelu_encoder()
    proto = copy.deepcopy(converted)
    counts = onnx_passes.run_passes(proto, target=onnx_passes.Target("fused", 23))
    assert counts["erfc"] == 1 and counts["opset"] == 1 and counts["rotary"] == 2
    assert counts["cse"] > 0
    assert list(counts) == [p.name for p in onnx_passes.PASSES]
    again = onnx_passes.run_passes(proto, target=onnx_passes.Target("fused", 23))
    assert again["erfc"] == again["opset"] == again["rotary"] == 0


_FORBIDDEN = ("tensorflow", "keras", "tf2onnx")


def test_nothing_under_onnx_passes_imports_tensorflow_keras_or_a_layer():
    folder = Path(onnx_passes.__file__).parent
    for path in sorted(folder.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            else:
                continue
            for name in names:
                assert name.split(".")[0] not in _FORBIDDEN, (path.name, name)
                if name.startswith("keras_posenc"):
                    # Only the passes' own modules and the rotation scope, which imports nothing.
                    assert name.startswith("keras_posenc.export.onnx_passes") or name in (
                        "keras_posenc._scope",
                    ), (path.name, name)
