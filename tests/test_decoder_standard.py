"""`save_decoder(..., attention="standard")`: ONNX's own operators only, against a float64 decode.

The file must pick the tokens of the float64 numpy decoder of `decoder_reference.py` with
logits within optimum's float32 tolerance (1e-5 + 1e-4·|x|), for a left-padded batch,
through onnxruntime with one buffer per layer bound as past and present.
"""

from __future__ import annotations

import collections

import onnxruntime
import pytest
from decoder_reference import reference_greedy
from test_decoder_save import MAX_LENGTH, VOCABULARY, step_model

from keras_posenc.export import save_decoder
from keras_posenc.export.decoder import (
    check,
    decoder_cases,
    decoder_onnx,
    describe_decoder,
    onnx_greedy,
)


def _session(onnx_model):
    return onnxruntime.InferenceSession(
        onnx_model.SerializeToString(), providers=["CPUExecutionProvider"]
    )


@pytest.mark.parametrize(
    "options",
    [{}, {"mlp": "gelu", "rope_layout": "interleaved"}, {"rope_dim": 4, "head_dim": 8}],
    ids=["swiglu-half", "gelu-interleaved", "partial-rotary-head-8"],
)
def test_standard_matches_a_float64_decode(options):
    model = step_model(**options)
    session = _session(decoder_onnx(describe_decoder(model, MAX_LENGTH), "standard"))
    case = decoder_cases(VOCABULARY, MAX_LENGTH)[1]  # batch 4, left-padded
    prompts, mask, steps = case["prompts"], case["mask"], 12
    got = onnx_greedy(session, prompts, mask, steps, MAX_LENGTH)
    result = check.compare_greedy(reference_greedy(model, prompts, mask, steps), got, mask)
    assert result["passed"], result


def test_standard_graph_has_onnx_operators_only_and_writes_at_the_index():
    onnx_model = decoder_onnx(describe_decoder(step_model(), MAX_LENGTH), "standard")
    assert [(o.domain, o.version) for o in onnx_model.opset_import] == [("", 23)]
    ops = collections.Counter((node.domain, node.op_type) for node in onnx_model.graph.node)
    assert {domain for domain, _ in ops} == {""}
    layers = 2
    assert ops["", "Attention"] == layers and ops["", "ScatterND"] == 2 * layers
    assert ops["", "Where"] == 0  # no select over every slot
    scatters = [node for node in onnx_model.graph.node if node.op_type == "ScatterND"]
    assert sorted(node.output[0] for node in scatters) == sorted(
        f"present.{i}.{kind}" for i in range(layers) for kind in ("key", "value")
    )


def test_save_decoder_standard_serves_head_dims_gqa_refuses(tmp_path):
    report = save_decoder(
        step_model(head_dim=8),
        tmp_path / "out",
        max_length=MAX_LENGTH,
        attention="standard",
        formats="onnx",
    )
    assert report["passed"] and report["attention"] == "standard"
    assert [case["runtimes"]["onnxruntime"]["same_tokens"] for case in report["cases"]] == [
        True,
        True,
        True,  # the teacher-forced case
    ]


def test_standard_serves_a_cache_buffer_shorter_than_the_export():
    """onnxruntime-genai sizes the shared buffer by its search's max_length, not the file's."""
    model = step_model()
    session = _session(decoder_onnx(describe_decoder(model, MAX_LENGTH), "standard"))
    case = decoder_cases(VOCABULARY, MAX_LENGTH)[1]
    prompts, mask, steps = case["prompts"], case["mask"], 12
    got = onnx_greedy(session, prompts, mask, steps, 24)  # 8 + 12 tokens in 24 slots
    result = check.compare_greedy(reference_greedy(model, prompts, mask, steps), got, mask)
    assert result["passed"], result
