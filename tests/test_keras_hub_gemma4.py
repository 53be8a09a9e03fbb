"""Gemma 4's published layouts through the export, against keras_hub (keras-hub 0.32).

One tiny random Gemma4CausalLM (`tiny_causal_lm_2026("gemma4")`, 4 layers local/global)
with every setting the published checkpoints add (`PUBLISHED`): global layers of their
own head size and K/V head count (31B: `global_head_dim`, `num_global_key_value_heads`),
the last two layers reading the caches of earlier ones (E2B/E4B: `num_kv_shared_layers`,
with `use_double_wide_mlp`) and per-layer embeddings (`hidden_size_per_layer_input`).
The GroupQueryAttention graph, the standard-op graph and the LiteRT file must generate
keras_hub's greedy tokens over 32 steps, batch 1 and a left-padded batch 4.

Logits: this model's float32 noise is 2-6e-5 on both sides (the export and keras_hub
against a float64 decode: measured in docs/keras_hub.md), so each runtime is held to
the exact logits rather than to keras_hub's float32 ones: keras_hub run in float64 on the same
weights. A runtime passes when it is no farther from them than twice keras_hub's own
float32 distance (the larger of the two cases: two float32 computations of the same
formula, each 2-6e-5 off here), its tokens equal to keras_hub's. What each setting
adds is checked to matter (left out, the tokens change), the shared layers' sources
against keras_hub's rule, the files' cache tensors, and the refusals.
"""

from __future__ import annotations

import dataclasses
import functools
import json

import numpy as np
import onnxruntime
import pytest
from keras_hub_models import MAX_LENGTH, VOCABULARY, tiny_causal_lm_2026

from keras_posenc.export import save_decoder
from keras_posenc.export.decoder import decoder_cases, decoder_onnx, onnx_greedy
from keras_posenc.export.decoder.litert_decoder import decoder_litert
from keras_posenc.export.decoder.litert_runner import litert_greedy
from keras_posenc.export.errors import ExportError
from keras_posenc.keras_hub import describe_causal_lm, keras_hub_greedy

PUBLISHED = dict(
    global_head_dim=64,  # local layers: 32
    num_global_key_value_heads=1,  # local layers: 2; K = V on the global layers
    num_kv_shared_layers=2,  # layer 2 reads layer 0's cache, layer 3 layer 1's
    use_double_wide_mlp=True,  # the shared layers' MLPs twice as wide
    hidden_size_per_layer_input=8,
)
STEPS = 32  # positions to 40: past the local window (16), within the 30 s budget


@functools.cache
def _models():
    """`(float32 CausalLM, its float64 twin)`: the same drawn weights."""
    return (
        tiny_causal_lm_2026("gemma4", **PUBLISHED),
        tiny_causal_lm_2026("gemma4", dtype="float64", **PUBLISHED),
    )


@functools.cache
def _references():
    """Per case: `(case, keras_hub float32 greedy, keras_hub float64 greedy)`."""
    float32, float64 = (keras_hub_greedy(lm) for lm in _models())  # each traced once
    out = []
    for case in decoder_cases(VOCABULARY, MAX_LENGTH):
        case = {**case, "steps": STEPS}
        args = case["prompts"], case["mask"], case["steps"]
        out.append((case, float32(*args), float64(*args)))
    return out


def _distance(got, exact, mask) -> float:
    """The largest |logit - exact| over the prompt's real tokens and every step."""
    rows = np.nonzero(mask.astype(bool))
    prompt = np.abs(np.float64(got[1][0][rows]) - exact[1][0][rows]).max()
    steps = max(
        np.abs(np.float64(g) - e).max() for g, e in zip(got[1][1:], exact[1][1:], strict=True)
    )
    return float(max(prompt, steps))


def _check(run) -> None:
    # The model's float32 noise: keras_hub's own distance, the larger of the two cases.
    noise = max(
        _distance(keras_hub, exact, case["mask"]) for case, keras_hub, exact in _references()
    )
    for case, keras_hub, exact in _references():
        got = run(case)
        np.testing.assert_array_equal(keras_hub[0], exact[0])  # the reference's tokens
        np.testing.assert_array_equal(got[0], keras_hub[0], err_msg=case["name"])
        assert _distance(got, exact, case["mask"]) <= 2 * noise, case["name"]


def _onnx_run(decoder, attention="gqa"):
    model = decoder_onnx(decoder, attention).SerializeToString()
    session = onnxruntime.InferenceSession(model, providers=["CPUExecutionProvider"])
    return lambda case: onnx_greedy(
        session, case["prompts"], case["mask"], case["steps"], MAX_LENGTH
    )


@pytest.mark.parametrize("attention", ["gqa", "standard"])
def test_onnx_generates_as_keras_hub(attention):
    _check(_onnx_run(describe_causal_lm(_models()[0], MAX_LENGTH), attention))


def test_litert_generates_as_keras_hub():
    content = decoder_litert(describe_causal_lm(_models()[0], MAX_LENGTH))
    _check(lambda case: litert_greedy(content, case["prompts"], case["mask"], case["steps"]))


def test_what_the_description_and_files_hold(tmp_path):
    decoder = describe_causal_lm(_models()[0], MAX_LENGTH)
    attentions = [block.attention for block in decoder.blocks]
    assert [a.head_dim for a in attentions] == [32, 64, 32, 64]
    assert [a.kv_num_heads for a in attentions] == [2, 1, 2, 1]
    assert [a.kv_source for a in attentions] == [None, None, 0, 1]
    assert [block.mlp.up.shape[1] for block in decoder.blocks] == [96, 96, 192, 192]
    assert decoder.per_layer_inputs.embedding.shape == (VOCABULARY, 4 * 8)
    # Caches of layers 0 and 1 only, each of its own shape; genai reads them per layer.
    inputs = {
        value.name: [d.dim_value or d.dim_param for d in value.type.tensor_type.shape.dim]
        for value in decoder_onnx(decoder).graph.input
    }
    assert inputs["past_key_values.0.key"] == ["batch_size", 2, "past_sequence_length", 32]
    assert inputs["past_key_values.1.value"] == ["batch_size", 1, "past_sequence_length", 64]
    assert not any(name.startswith(("past_key_values.2", "past_key_values.3")) for name in inputs)
    save_decoder(_models()[0], tmp_path, max_length=MAX_LENGTH, formats=("onnx",), verify=False)
    config = json.loads((tmp_path / "genai_config.json").read_text())["model"]["decoder"]
    assert (config["head_size"], config["num_key_value_heads"]) == (32, 2)


def _changed(decoder, **changes):
    return dataclasses.replace(decoder, **changes)


@pytest.mark.parametrize("part", ["per-layer gate", "per-layer inputs", "kv sources"])
def test_each_setting_matters(part):
    decoder = describe_causal_lm(_models()[0], MAX_LENGTH)
    blocks = decoder.blocks
    if part == "per-layer gate":
        broken = _changed(
            decoder, blocks=tuple(dataclasses.replace(b, per_layer_gate=None) for b in blocks)
        )
    elif part == "per-layer inputs":  # the embedding's half dropped: the projection's only
        ple = decoder.per_layer_inputs
        broken = _changed(decoder, per_layer_inputs=dataclasses.replace(ple, embedding_scale=0.0))
    else:  # layer 3 (global) reads layer 1's cache: made to compute its own instead
        source = blocks[1].attention
        own = dataclasses.replace(
            blocks[3].attention,
            kv_source=None,
            key=source.key,
            value=source.value,
            key_norm=source.key_norm,
            value_norm=source.value_norm,
        )
        broken = _changed(
            decoder, blocks=(*blocks[:3], dataclasses.replace(blocks[3], attention=own))
        )
    case, keras_hub, _ = _references()[1]
    assert not np.array_equal(_onnx_run(broken)(case)[0], keras_hub[0])


def _keras_hub_sources(layer_types: list[str], shared: int) -> list:
    """keras_hub's rule, written from its docstring: each of the last `shared` layers reads
    the most recent earlier non-shared layer of its own attention type."""
    first = len(layer_types) - shared
    sources = []
    for i, kind in enumerate(layer_types):
        earlier = [j for j in range(first) if layer_types[j] == kind]
        sources.append(earlier[-1] if i >= first else None)
    return sources


def test_kv_sources_follow_keras_hubs_rule():
    types = ["sliding_attention", "full_attention", "sliding_attention"] * 2
    lm = tiny_causal_lm_2026("gemma4", num_layers=6, layer_types=types, num_kv_shared_layers=3)
    decoder = describe_causal_lm(lm, MAX_LENGTH)
    sources = [block.attention.kv_source for block in decoder.blocks]
    assert sources == _keras_hub_sources(types, 3) == [None, None, None, 2, 1, 2]


@pytest.mark.parametrize(
    "options, message",
    [
        (
            dict(
                enable_moe_block=True,
                num_experts=2,
                expert_intermediate_dim=16,
                num_experts_per_token=1,
            ),
            "Gemma4CausalLM with enable_moe_block is not exported",
        ),
        (dict(num_kv_shared_layers=4), r"layer 0 shares the keys and values of layer 0, which"),
    ],
)
def test_refusals(options, message):
    with pytest.raises(ExportError, match=message):
        describe_causal_lm(tiny_causal_lm_2026("gemma4", **options), MAX_LENGTH)


def test_gqa_refuses_a_shared_layer_of_other_tables():
    """GroupQueryAttention rotates the shared keys again, by the sharing layer's tables:
    a layer whose tables are not its source's is refused there (the other files read the
    source's cache as written)."""
    decoder = describe_causal_lm(_models()[0], MAX_LENGTH)
    rope = decoder.rope
    other = dataclasses.replace(rope, sin=-rope.sin)  # layer 2's source, layer 0, has `rope`
    block = decoder.blocks[2]
    block = dataclasses.replace(block, attention=dataclasses.replace(block.attention, rope=other))
    broken = _changed(decoder, blocks=(*decoder.blocks[:2], block, decoder.blocks[3]))
    with pytest.raises(ExportError, match="shares the keys and values of layer 0, whose RoPE"):
        decoder_onnx(broken)
    decoder_onnx(broken, "standard")  # written: it reads the source's cache
