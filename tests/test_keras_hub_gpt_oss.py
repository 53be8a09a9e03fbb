"""keras_hub's GptOssCausalLM through `save_decoder`, verified against keras_hub itself.

A tiny random GPT-OSS (`keras_hub_models.tiny_gpt_oss`: two layers, the second with a
window of 8, four experts of which two a token, YaRN by 32, sinks of the order of the
scores) is exported as the GroupQueryAttention graph with its LiteRT file, and as the
standard-op graph: each must generate keras_hub's greedy tokens over 64 steps, batch 1
and a left-padded batch 4, with logits within 1e-5 + 1e-4·|x| (`save_decoder`'s own
check, float32's error over these depths). The GroupQueryAttention file writes each
layer's experts as one `com.microsoft.MoE` (the standard-op file densely); both mixtures
are checked against a numpy float64 formula within float32's error bound. Each part
GPT-OSS adds is checked to matter (dropped or changed, the tokens change), the YaRN
tables against numpy's float64 formula, and each refusal.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import numpy as np
import onnx
import onnxruntime
import pytest
from float32_error import Bounded, assert_within
from keras_hub_models import GENAI, MAX_LENGTH, VOCABULARY, tiny_gpt_oss
from onnx import TensorProto, helper

from keras_posenc.export import save_decoder
from keras_posenc.export.decoder import (
    compare_greedy,
    decoder_cases,
    decoder_onnx,
    onnx_greedy,
    runtime_version,
)
from keras_posenc.export.decoder.graph_builder import GraphBuilder
from keras_posenc.export.decoder.moe import moe_contrib, moe_onnx
from keras_posenc.export.errors import ExportError
from keras_posenc.keras_hub import describe_causal_lm, keras_hub_greedy, rebuild

OLDER_ONNXRUNTIME = runtime_version._installed() < (1, 32)


@functools.cache
def _tiny():
    return tiny_gpt_oss()


@functools.cache
def _reference():
    """`(decoder, case, keras_hub's tokens and logits)`: 24 steps of the left-padded batch
    (positions to 31, past the window of 8)."""
    causal_lm = _tiny()
    case = {**decoder_cases(VOCABULARY, MAX_LENGTH)[1], "steps": 24}
    expected = keras_hub_greedy(causal_lm)(case["prompts"], case["mask"], case["steps"])
    return describe_causal_lm(causal_lm, MAX_LENGTH), case, expected


@pytest.mark.parametrize(
    "attention, formats", [("gqa", ("onnx", "litert")), ("standard", ("onnx",))]
)
def test_export_generates_as_keras_hub(tmp_path, attention, formats):
    if OLDER_ONNXRUNTIME:
        with pytest.raises(ExportError, match="attention sinks"):
            save_decoder(_tiny(), tmp_path / "out", max_length=MAX_LENGTH, attention=attention)
        return
    report = save_decoder(
        _tiny(), tmp_path / "out", max_length=MAX_LENGTH, attention=attention, formats=formats
    )
    assert report["passed"] and report["attention"] == attention
    names = [case["name"] for case in report["cases"]]
    # Its window (8 + 1 keys, every other layer) is below max_length: the third case passes it.
    assert names == [
        "batch 1",
        "batch 4 left-padded",
        "batch 2 past the window of 9 (one row left-padded)",
        f"teacher-forced, positions 0..{MAX_LENGTH - 1} (batch 1, one call)",
    ]
    assert [case["steps"] for case in report["cases"]][:2] == [64, 64]
    runtimes = ["litert", "onnxruntime"] if "litert" in formats else ["onnxruntime"]
    runtimes = sorted(runtimes + GENAI)  # og.Model on the folder, where it is installed
    for case in report["cases"]:
        assert sorted(case["runtimes"]) == runtimes
        for result in case["runtimes"].values():
            assert result["same_tokens"] and result["within_tolerance"], (case["name"], result)
    assert (tmp_path / "out" / "model.tflite").exists() == ("litert" in formats)
    ops = [node.op_type for node in onnx.load(tmp_path / "out" / "model.onnx").graph.node]
    # The tokens above are those of one MoE per layer (GroupQueryAttention) or of the
    # dense experts (standard), not the other's.
    if attention == "gqa":
        assert ops.count("MoE") == 2 and "TopK" not in ops and "OneHot" not in ops
    else:
        assert "MoE" not in ops and ops.count("TopK") == 2


def _attentions(decoder, **changes):
    blocks = tuple(
        dataclasses.replace(b, attention=dataclasses.replace(b.attention, **changes))
        for b in decoder.blocks
    )
    return dataclasses.replace(decoder, blocks=blocks)


def _mlps(decoder, **changes):
    blocks = tuple(
        dataclasses.replace(b, mlp=dataclasses.replace(b.mlp, **changes)) for b in decoder.blocks
    )
    return dataclasses.replace(decoder, blocks=blocks)


def _window(decoder, window):
    first, second = decoder.blocks
    attention = dataclasses.replace(second.attention, window=window)
    return dataclasses.replace(
        decoder, blocks=(first, dataclasses.replace(second, attention=attention))
    )


def _plain_rope(decoder):
    from keras_posenc.keras_hub.rotary_layers import exact_tables

    return dataclasses.replace(decoder, rope=exact_tables(16, 10000.0, None, MAX_LENGTH))


CHANGES = {
    "sinks": lambda d: _attentions(d, sinks=None),
    "window": lambda d: _window(d, None),
    "window - 1": lambda d: _window(d, 8),  # keras_hub's sliding_window itself
    "window + 1": lambda d: _window(d, 10),
    "q/k/v biases": lambda d: _attentions(d, query_bias=None, key_bias=None, value_bias=None),
    "output bias": lambda d: _attentions(d, output_bias=None),
    "clamp": lambda d: _mlps(d, limit=math.inf),
    "alpha": lambda d: _mlps(d, alpha=1.0),
    "top k": lambda d: _mlps(d, top_k=1),
    "router bias": lambda d: _mlps(d, router_bias=np.zeros(4, np.float32)),
    "yarn": _plain_rope,
}


def _onnx_run(decoder, case):
    session = onnxruntime.InferenceSession(
        decoder_onnx(decoder).SerializeToString(), providers=["CPUExecutionProvider"]
    )
    return onnx_greedy(session, case["prompts"], case["mask"], case["steps"], MAX_LENGTH)


@pytest.mark.skipif(OLDER_ONNXRUNTIME, reason="sinks are refused below onnxruntime 1.32")
@pytest.mark.parametrize("change", list(CHANGES))
def test_each_part_matters(change):
    """Dropped or changed (the window by one either way), each part GPT-OSS adds changes
    keras_hub's tokens: the verification above would catch it read or written wrongly."""
    decoder, case, expected = _reference()
    assert compare_greedy(expected, _onnx_run(decoder, case), case["mask"])["passed"]
    broken = compare_greedy(expected, _onnx_run(CHANGES[change](decoder), case), case["mask"])
    assert not broken["same_tokens"]


def test_yarn_tables_are_numpy_float64():
    """keras_hub's YaRN as transformers writes it (truncate=False, original length 4096,
    betas 32 and 1), its attention factor 1 + 0.1 ln 32, in float64 rounded once."""
    rope = describe_causal_lm(_tiny(), MAX_LENGTH).rope
    dim, base, factor, original = 16, 10000.0, 32.0, 4096
    extrapolated = base ** (-np.arange(0, dim, 2, dtype=np.float64) / dim)

    def correction(rotations):
        return dim * np.log(original / (rotations * 2 * np.pi)) / (2 * np.log(base))

    low, high = max(correction(32.0), 0.0), min(correction(1.0), dim - 1.0)
    ramp = np.clip((np.arange(dim // 2) - low) / (high - low), 0.0, 1.0)
    inverse = extrapolated / factor * ramp + extrapolated * (1 - ramp)
    angles = np.arange(MAX_LENGTH, dtype=np.float64)[:, None] * inverse
    scale = 1 + 0.1 * np.log(factor)
    # One rounding of values below 1.35: half a float32 unit at 1 is 2**-24.
    np.testing.assert_allclose(rope.cos, np.cos(angles) * scale, rtol=0, atol=2.0**-23)
    np.testing.assert_allclose(rope.sin, np.sin(angles) * scale, rtol=0, atol=2.0**-23)
    assert ((0 < ramp) & (ramp < 1)).any()  # channels between the two, blended


def test_rebuild_refuses_gpt_oss():
    message = "attention output biases, attention sinks, sliding windows, mixture-of-experts"
    with pytest.raises(ExportError, match=message):
        rebuild(_tiny(), MAX_LENGTH)


def test_dropout_is_refused():
    with pytest.raises(ExportError, match=r"dropout=0\.1"):
        describe_causal_lm(tiny_gpt_oss(dropout=0.1), MAX_LENGTH)


@pytest.mark.parametrize(
    "attention, parts",
    [
        # GroupQueryAttention's MoE op is verified with 1.32 alone too; the dense experts
        # are ONNX's own operators.
        ("gqa", "attention sinks, sliding windows, mixture-of-experts MLPs"),
        ("standard", "attention sinks"),
    ],
)
def test_sinks_refused_below_onnxruntime_1_32(monkeypatch, attention, parts):
    decoder = describe_causal_lm(_tiny(), MAX_LENGTH)
    monkeypatch.setattr(runtime_version, "_installed", lambda: (1, 23))
    with pytest.raises(ExportError, match=f"has {parts}, which onnxruntime 1\\.23"):
        runtime_version.refuse_older_onnxruntime(decoder, attention)
    monkeypatch.setattr(runtime_version, "_installed", lambda: (1, 32))
    runtime_version.refuse_older_onnxruntime(decoder, attention)


@pytest.mark.skipif(OLDER_ONNXRUNTIME, reason="sinks are refused below onnxruntime 1.32")
@pytest.mark.parametrize("attention", ["gqa", "standard"])
def test_sinks_with_soft_caps_are_refused(attention):
    capped = _attentions(describe_causal_lm(_tiny(), MAX_LENGTH), softcap=5.0)
    with pytest.raises(ExportError, match="attention sinks and soft-capped scores together"):
        decoder_onnx(capped, attention)


def _moe_session(write, moe, width: int):
    """One mixture of experts, `x (batch, sequence, width) -> y`, as `write` emits it."""
    g = GraphBuilder()
    g.node("Identity", [write(g, 0, "x", moe)], ["y"])
    shape = ["batch", "sequence", width]
    model = g.model(
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)],
        21,
    )
    return onnxruntime.InferenceSession(
        model.SerializeToString(), providers=["CPUExecutionProvider"]
    )


def moe_reference(x: np.ndarray, moe, renormalized: bool) -> Bounded:
    """keras_hub's mixture of experts `(tokens, width)` in float64 with float32's error
    bound, the routing weights as keras_hub writes them (a softmax of the top-k logits)
    or, `renormalized`, as the MoE op does (the top k of a softmax of all, over their
    sum): the same value, each order's own rounding."""
    x = Bounded(x)
    logits = np.einsum("tw,we->te", x, moe.router) + moe.router_bias
    order = np.argsort(-logits.value, axis=-1)
    out = Bounded(np.zeros(x.shape), 0.0)
    for t in range(x.shape[0]):
        row, top = logits[t], order[t, : moe.top_k]
        # The selection is float32's too: the k-th logit stands clear of the next.
        assert row.value[top[-1]] - row.value[order[t, moe.top_k]] > 2 * row.error.max()
        if renormalized:
            p = np.exp(row - row.max())
            p = p / p.sum()
            weights = p[top] / p[top].sum()
        else:
            p = np.exp(row[top] - row[top].max())
            weights = p / p.sum()
        total = Bounded(np.zeros(x.shape[1]), 0.0)
        for j, e in enumerate(top):
            gate = np.einsum("w,wi->i", x[t], moe.gate[e]) + moe.gate_bias[e]
            up = np.einsum("w,wi->i", x[t], moe.up[e]) + moe.up_bias[e]
            # A clamp moves a float32 value no farther from the float64 one.
            gate = Bounded(np.minimum(gate.value, moe.limit), gate.error)
            up = Bounded(np.clip(up.value, -moe.limit, moe.limit), up.error)
            units = (up + 1.0) * (gate / (np.exp(gate * -moe.alpha) + 1.0))
            expert = np.einsum("i,iw->w", units, moe.down[e]) + moe.down_bias[e]
            total = weights[j] * expert + total
        out[t] = total
    return out


@pytest.mark.skipif(
    runtime_version._installed() < runtime_version.VERIFIED_FROM,
    reason="com.microsoft.MoE has no kernel before onnxruntime 1.32 (save_decoder refuses it)",
)
def test_moe_op_and_dense_experts_are_keras_hubs_formula():
    """`com.microsoft.MoE` (GroupQueryAttention's) and the dense experts (standard-op)
    each within float32's bound of numpy's float64 keras_hub formula, on the tiny model's
    experts with their clamps active."""
    decoder = describe_causal_lm(_tiny(), MAX_LENGTH)
    moe, width = decoder.blocks[1].mlp, decoder.width
    x = np.random.default_rng(3).standard_normal((1, 6, width)).astype(np.float32)
    gate = np.einsum("tw,ewi->tei", x[0], moe.gate) + moe.gate_bias
    up = np.einsum("tw,ewi->tei", x[0], moe.up) + moe.up_bias
    assert (gate > moe.limit).any() and (np.abs(up) > moe.limit).any()  # clamps matter
    # The dense form weighs the units before the down projection rather than after: the
    # same products reassociated, each rounded once, which the bound's margin covers.
    for write, renormalized in ((moe_contrib, True), (moe_onnx, False)):
        (got,) = _moe_session(write, moe, width).run(None, {"x": x})
        assert_within(got[0], moe_reference(x[0], moe, renormalized))
