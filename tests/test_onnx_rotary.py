"""The rotary pass (`onnx_passes.rotary`): each rewritten export still matches Keras.

Every RoPE configuration is exported once (`export.onnx_model`), rewritten in each form and
run in onnxruntime on shapes and starts that reach the cached rows, the rows past them,
and both sides of a scaling switch; the graph is checked for the kernel node (fused) or
for the absence of a whole-tensor transpose of the rotation's input (decomposed).
"""

from __future__ import annotations

import copy
import functools

import hand_built
import keras
import numpy as np
import onnx
import pytest
from attention_error import attention_error
from float32_error import assert_within_bound, rotation_error

from keras_posenc import RotaryEmbedding, RotaryMultiHeadAttention, export
from keras_posenc.export import onnx_passes
from keras_posenc.export.onnx_passes import rotary

HEADS, DIM = 2, 8


_session = hand_built.session


def _rope_model(layer_kwargs: dict, inputs: str, shape: tuple = (None, HEADS, DIM)) -> keras.Model:
    x = keras.Input(shape, name="x")
    model_inputs, call = [x], {}
    if inputs == "start":
        start = keras.Input((), dtype="int32", name="start", batch_size=1)
        model_inputs.append(start)
        call["start_index"] = start[0]
    elif inputs.startswith("positions"):
        # "positions" (batch, sequence), "positions3" (batch, sequence, 3 axes).
        axes = (int(inputs[len("positions") :]),) if inputs != "positions" else ()
        positions = keras.Input((None, *axes), dtype="int32", name="positions")
        model_inputs.append(positions)
        call["positions"] = positions
    return keras.Model(model_inputs, RotaryEmbedding(**layer_kwargs)(x, **call))


def _attention_model(layer_kwargs: dict) -> keras.Model:
    x = keras.Input((None, 16), name="x")
    start = keras.Input((), dtype="int32", name="start", batch_size=1)
    attention = RotaryMultiHeadAttention(num_heads=HEADS, key_dim=DIM, **layer_kwargs)
    y = attention(x, x, query_start_index=start[0], key_start_index=start[0])
    return keras.Model([x, start], y)


# name: (model, rotations, feeds per case as (batch, sequence, start or positions scale))
LONGROPE = {
    "rope_type": "longrope",
    "short_factor": [1.0, 1.0, 1.5, 2.0],
    "long_factor": [1.0, 2.0, 4.0, 8.0],
    "original_max_position_embeddings": 6,
    "max_position_embeddings": 24,
}
CONFIGS = {
    "half": ({}, "none"),
    "interleaved": ({"layout": "interleaved"}, "none"),
    "partial_half": ({"rotary_dim": 4}, "none"),
    "partial_interleaved": ({"rotary_dim": 4, "layout": "interleaved"}, "none"),
    "start_half": ({}, "start"),
    "start_interleaved": ({"layout": "interleaved"}, "start"),
    "positions_half": ({}, "positions"),
    "positions_interleaved": ({"layout": "interleaved"}, "positions"),
    "axial": ({"axes_dims": (4, 4)}, "positions2"),
    "mrope": ({"mrope_section": (2, 1, 1)}, "positions3"),
    "rank3": ({}, "rank3"),
    "heads_first": ({"sequence_axis": 2}, "heads_first"),
    "linear": ({"scaling": {"rope_type": "linear", "factor": 2.0}}, "start"),
    "dynamic": (
        {"scaling": {"rope_type": "dynamic", "factor": 2.0, "max_position_embeddings": 6}},
        "start",
    ),
    "yarn": (
        {"scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 6}},
        "start",
    ),
    "llama3": (
        {
            "scaling": {
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 6,
            }
        },
        "start",
    ),
    "longrope": ({"scaling": LONGROPE}, "start"),
    "attention_half": ({}, "attention"),
    "attention_interleaved_partial": (
        {"rotary_layout": "interleaved", "rotary_dim": 4},
        "attention",
    ),
    "attention_dynamic": (
        {
            "rotary_scaling": {
                "rope_type": "dynamic",
                "factor": 2.0,
                "max_position_embeddings": 6,
            }
        },
        "attention",
    ),
}
# (batch, sequence, start): starts in the cache, across its end, past it; lengths on both
# sides of the scaling switches (6).
STARTS = [(2, 5, 0), (1, 9, 4090), (2, 3, 70000), (1, 1, 16_000_000)]


@functools.cache
def _exported(name: str):
    layer_kwargs, inputs = CONFIGS[name]
    if inputs == "attention":
        model = _attention_model(layer_kwargs)
    elif inputs == "rank3":
        model = _rope_model(layer_kwargs, "none", (None, DIM))
    elif inputs == "heads_first":
        # export keeps the sequence on axis 1: the model puts the heads first itself.
        x = keras.Input((None, HEADS, DIM), name="x")
        heads_first = keras.layers.Permute((2, 1, 3))(x)
        model = keras.Model(x, RotaryEmbedding(**layer_kwargs)(heads_first))
    else:
        model = _rope_model(layer_kwargs, inputs)
    return model, export.onnx_model(model, rotary=None)


@functools.cache
def _cases(name: str) -> list[tuple[dict[str, np.ndarray], np.ndarray]]:
    """`(feeds, what Keras returns for them)` for each case of a configuration."""
    model, _ = _exported(name)
    return [(feeds, _keras(model, feeds)) for feeds in _feeds(name)]


def _feeds(name: str) -> list[dict[str, np.ndarray]]:
    _, inputs = CONFIGS[name]
    rng = np.random.default_rng(0)

    def x(batch, sequence):
        shape = {
            "attention": (batch, sequence, 16),
            "rank3": (batch, sequence, DIM),
        }.get(inputs, (batch, sequence, HEADS, DIM))
        return rng.standard_normal(shape).astype(np.float32)

    if inputs in ("start", "attention"):
        return [{"x": x(b, n), "start": np.array([s], np.int32)} for b, n, s in STARTS]
    if inputs.startswith("positions"):
        axes = (int(inputs[len("positions") :]),) if inputs != "positions" else ()
        return [
            {"x": x(b, n), "positions": rng.integers(0, high, (b, n, *axes)).astype(np.int32)}
            for b, n, high in [(2, 5, 4096), (2, 7, 2**24)]
        ]
    # Start 0, lengths within the cache and past it.
    return [{"x": x(2, 5)}, {"x": x(1, 4100)}]


def _keras(model: keras.Model, feeds: dict) -> np.ndarray:
    values = list(feeds.values())
    return np.asarray(model(values if len(values) > 1 else values[0]))


def _rewritten(proto: onnx.ModelProto, form: str) -> tuple[onnx.ModelProto, int]:
    proto = copy.deepcopy(proto)
    if form == "standard":
        proto = onnx_passes.to_opset(proto, onnx_passes.STANDARD_ROTARY_OPSET)
    count = onnx_passes.rewrite_rotations(proto, form)
    onnx.checker.check_model(proto, full_check=True)
    return proto, count


def _transposed_sources(proto: onnx.ModelProto) -> set[str]:
    """Tensors that reach a Transpose or ReverseSequence through reshapes only."""
    sources = set()
    for graph in onnx_passes.graphs(proto.graph):
        producers = {name: node for node in graph.node for name in node.output}
        for node in graph.node:
            if node.op_type not in ("Transpose", "ReverseSequence"):
                continue
            tensor = node.input[0]
            while True:
                sources.add(tensor)
                producer = producers.get(tensor)
                if producer is None or producer.op_type not in ("Reshape", "Cast", "Identity"):
                    break
                tensor = producer.input[0]
    return sources


@pytest.mark.parametrize("form", onnx_passes.FORMS)
@pytest.mark.parametrize("name", CONFIGS)
def test_rewritten_export_matches_keras(name, form):
    _, base = _exported(name)
    inputs = CONFIGS[name][1]
    rotations = onnx_passes.find_rotations(base)
    assert len(rotations) == (2 if inputs == "attention" else 1)
    inputs_of_rotations = {r.x for r in rotations}

    proto, count = _rewritten(base, form)
    assert count == len(rotations)
    assert [i.name for i in proto.graph.input] == [i.name for i in base.graph.input]
    assert [o.name for o in proto.graph.output] == [o.name for o in base.graph.output]
    counts = onnx_passes.op_counts(proto)
    kernel = {"fused": "com.microsoft:RotaryEmbedding", "standard": "RotaryEmbedding"}.get(form)
    if kernel:
        assert counts.get(kernel, 0) == len(rotations), counts
        assert not onnx_passes.find_rotations(proto)
    else:
        assert "RotaryEmbedding" not in counts and "com.microsoft:RotaryEmbedding" not in counts
    assert not inputs_of_rotations & _transposed_sources(proto)
    assert "ReverseSequence" not in counts
    if inputs not in ("attention", "heads_first"):
        assert "Transpose" not in counts, counts

    session = _session(proto)
    for (feeds, expected), bound in zip(_cases(name), _bounds(name), strict=True):
        (actual,) = session.run(None, feeds)
        assert actual.shape == expected.shape
        # Keras and the file each within `bound` of the exact result: twice it apart.
        assert_within_bound(actual, expected, 2 * bound, what=f"{name} {form}")


@functools.cache
def _bounds(name: str) -> list[np.ndarray]:
    """Per case of `_cases`, the most a float32 evaluation can be off: `rotation_error`
    for a RoPE (tables times an attention factor: YaRN's 1.14 and LongRoPE's 1.33 are
    below the 2 taken), `attention_error` (full self-attention) for the attention layer,
    with the probabilities of its float64 twin (the same weights)."""
    model, _ = _exported(name)
    layer_kwargs, inputs = CONFIGS[name]
    feeds = _feeds(name)
    if inputs != "attention":
        factor = 2.0 if "scaling" in layer_kwargs else 1.0
        axes = (1, 2) if inputs == "heads_first" else (1, 1)  # the model's own Permute
        return [rotation_error(np.swapaxes(f["x"], *axes), factor=factor) for f in feeds]
    (layer,) = [layer for layer in model.layers if isinstance(layer, RotaryMultiHeadAttention)]
    twin = RotaryMultiHeadAttention.from_config({**layer.get_config(), "dtype": "float64"})
    bounds = []
    for case in feeds:
        x, start = case["x"].astype(np.float64), int(case["start"][0])
        starts = {"query_start_index": start, "key_start_index": start}
        if not twin.built:
            twin(x, x, **starts)
            twin.set_weights([w.astype(np.float64) for w in layer.get_weights()])
        _, weights = twin(x, x, **starts, return_attention_scores=True)
        kernels = {}
        for variable in layer.weights:
            role, kind = variable.path.split("/")[-2:]
            role = {"attention_output": "output"}.get(role, role)
            value = np.asarray(variable, np.float64)
            if kind == "kernel":
                kernels[role] = value.reshape(16, -1) if role != "output" else value.reshape(-1, 16)
            else:
                kernels[f"{role}_bias"] = value.ravel()
        bound = attention_error(
            x,
            kernels,
            heads=HEADS,
            kv_heads=HEADS,
            head_dim=DIM,
            scale=DIM**-0.5,
            weights=np.asarray(weights, np.float64),
            causal=False,
        )
        bounds.append(bound)
    return bounds


def test_rewrite_rejects_an_unknown_form_and_the_wrong_opset():
    _, base = _exported("half")
    with pytest.raises(ValueError, match="expected one of"):
        onnx_passes.rewrite_rotations(copy.deepcopy(base), "fast")
    with pytest.raises(ValueError, match="to_opset"):
        onnx_passes.rewrite_rotations(copy.deepcopy(base), "standard")
    upgraded = onnx_passes.to_opset(base, onnx_passes.STANDARD_ROTARY_OPSET)
    with pytest.raises(ValueError, match="form='standard'"):
        onnx_passes.rewrite_rotations(upgraded, "fused")


def test_a_model_without_rotation_is_left_as_it_is():
    x = keras.Input((None, 8), name="x")
    model = keras.Model(x, keras.layers.Dense(8)(x))
    proto = export.onnx_model(model, rotary=None)
    before = proto.SerializeToString()
    assert onnx_passes.rewrite_rotations(proto, "fused") == 0
    assert proto.SerializeToString() == before


def test_a_marked_rotation_that_is_not_found_is_an_error():
    # The sum of one of the attention layer's two rotations written as another op: its
    # scope still holds the products, and the pass must not leave it unrewritten silently.
    _, base = _exported("attention_half")
    broken = copy.deepcopy(base)
    first, second = rotary.find_rotations(broken)
    first.add.op_type = "Sum"
    assert len(rotary.marked_scopes(broken)) == 2
    assert [r.scope for r in rotary.find_rotations(broken)] == [second.scope]
    before = broken.SerializeToString()
    with pytest.raises(rotary.RotationMismatch, match="2 rotation.*1 were found") as raised:
        rotary.rewrite_rotations(broken, "fused")
    assert first.scope in str(raised.value) and second.scope not in str(raised.value)
    assert broken.SerializeToString() == before  # raised before rewriting anything


@pytest.mark.parametrize("form", ["fused", "decomposed"])
def test_the_scopes_marked_after_a_rewrite_are_the_rotations_found(form):
    # Fused, a rotation's products and sum are gone (nothing marked, nothing found);
    # decomposed, they stay and are found again.
    _, base = _exported("attention_half")
    proto, count = _rewritten(base, form)
    marked = rotary.marked_scopes(proto)
    assert len(marked) == (0 if form == "fused" else count)
    assert rotary.rewrite_rotations(proto, form) == len(marked)
