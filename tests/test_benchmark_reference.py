"""The benchmarks' genai-style reference graph (`benchmarks/gqa_reference.py`) computes the model.

It is built from the `Decoder` description the export reads; for its timings to be those
of the same model, its greedy generation must be keras_hub's own (`keras_hub_greedy`:
`call_with_cache` driven as `generate()` drives it) for the families that between them
hold every part it writes: Qwen2's biases, Gemma 2's soft caps, sliding windows (16
slots, passed by the 41 positions), post norms, GeGLU and embedding scale, Gemma 3's q/k
norms and per-layer RoPE tables. Batch 1 without padding (the reference has no
left-padding re-pack, as the genai builder has none), within the export's tolerance.
"""

from __future__ import annotations

import numpy as np
import onnxruntime
import pytest
from keras_hub_models import MAX_LENGTH, VOCABULARY, tiny_causal_lm

from benchmarks.gqa_reference import reference_graph
from keras_posenc.export.decoder import compare_greedy, onnx_greedy, runtime_version
from keras_posenc.keras_hub import describe_causal_lm, keras_hub_greedy

STEPS = 32


@pytest.mark.skipif(
    runtime_version._installed() < (1, 32),
    reason="windows and soft caps in GroupQueryAttention need onnxruntime >= 1.32",
)
@pytest.mark.parametrize("family", ["qwen2", "gemma2", "gemma3"])
def test_reference_graph_generates_as_keras_hub(family):
    causal_lm = tiny_causal_lm(family)
    graph = reference_graph(describe_causal_lm(causal_lm, MAX_LENGTH))
    session = onnxruntime.InferenceSession(
        graph.SerializeToString(), providers=["CPUExecutionProvider"]
    )
    prompts = np.random.default_rng(0).integers(1, VOCABULARY, (1, 8))
    mask = np.ones_like(prompts)
    expected = keras_hub_greedy(causal_lm)(prompts, mask, STEPS)
    result = compare_greedy(expected, onnx_greedy(session, prompts, mask, STEPS, MAX_LENGTH), mask)
    assert result["passed"], result
