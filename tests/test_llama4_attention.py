"""Llama 4's attention in `RotaryGroupQueryAttention`: chunked attention on its RoPE layers,
the attention temperature on its NoPE layers, against transformers' `Llama4TextAttention`.

A tiny random Llama 4 text config with a RoPE layer (chunked) and a NoPE layer (tempered);
both attention modules run side by side with the Keras layers given the same weights, for
a prefill and two cached decode steps, one of them across a chunk boundary. The chunk size
and the temperature's `floor_scale` are small, so that both change the outputs here.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
from attention_parity import exact_attention
from float32_error import assert_within_bound

from keras_posenc import RotaryGroupQueryAttention, attention_temperature
from keras_posenc import export as kpe
from keras_posenc.configs.arguments import attention_arguments
from keras_posenc.layers.decoder_block import DecoderBlock

torch = pytest.importorskip("torch")
llama4 = pytest.importorskip("transformers.models.llama4.modeling_llama4")

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, CHUNK, MAX_LENGTH = 32, 4, 2, 8, 3, 8
CONFIG = {
    "model_type": "llama4_text",
    "hidden_size": HIDDEN,
    "num_attention_heads": HEADS,
    "num_key_value_heads": KV_HEADS,
    "head_dim": HEAD_DIM,
    "num_hidden_layers": 2,
    "no_rope_layers": [1, 0],  # layer 0 RoPE (chunked), layer 1 NoPE (tempered)
    "attention_chunk_size": CHUNK,
    "floor_scale": 2,
    "attn_scale": 0.5,
    "use_qk_norm": False,
    "intermediate_size": 16,
    "intermediate_size_mlp": 16,
    "vocab_size": 16,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
}


def _torch_side():
    from transformers import DynamicCache, Llama4TextConfig
    from transformers.masking_utils import create_causal_mask, create_chunked_causal_mask

    config = Llama4TextConfig(**{k: v for k, v in CONFIG.items() if k != "model_type"})
    config._attn_implementation = "eager"
    assert config.layer_types == ["chunked_attention", "full_attention"]
    torch.manual_seed(0)
    layers = [llama4.Llama4TextAttention(config, i).eval() for i in (0, 1)]
    for layer in layers:
        for weight in layer.parameters():
            torch.nn.init.normal_(weight, std=0.3)
    rotary = llama4.Llama4TextRotaryEmbedding(config)
    cache = DynamicCache(config=config)
    makers = {"chunked_attention": create_chunked_causal_mask, "full_attention": create_causal_mask}

    def step(x: np.ndarray, start: int, padding=None) -> list[np.ndarray]:
        x = torch.from_numpy(x)
        position_ids = torch.arange(start, start + x.shape[1])[None]
        if padding is not None:  # the padding of every token so far, as `generate` gives it
            padding = torch.from_numpy(padding[:, : start + x.shape[1]].astype(np.int64))
        masks = {
            kind: make(config, x, padding, cache, position_ids=position_ids)
            for kind, make in makers.items()
        }
        with torch.no_grad():
            freqs = rotary(x, position_ids)
            return [
                layer(x, freqs, masks[config.layer_types[i]], cache=cache)[0].numpy()
                for i, layer in enumerate(layers)
            ]

    def exact(x: np.ndarray, padding=None) -> list:
        """Per layer `(output, float32 bound)` of `x` from position 0, no cache, in float64."""
        tokens = torch.from_numpy(x)
        position_ids = torch.arange(x.shape[1])[None]
        if padding is not None:
            padding = torch.from_numpy(padding[:, : x.shape[1]].astype(np.int64))
        results = []
        for i, layer in enumerate(layers):
            make = makers[config.layer_types[i]]
            mask = make(config, tokens, padding, None, position_ids=position_ids)
            arguments = {"position_embeddings": rotary(tokens, position_ids)}
            arguments["attention_mask"] = mask
            factor = None
            if layer.attn_temperature_tuning and not layer.use_rope:  # transformers' formula
                positions = np.arange(x.shape[1], dtype=np.float64)
                factor = np.log1p(np.floor((positions + 1) / layer.floor_scale))
                factor = factor * layer.attn_scale + 1
            results.append(exact_attention(layer, x, arguments, query_factor=factor))
        return results

    step.exact = exact
    return layers, step


def _keras_layers(torch_layers):
    rope = RotaryGroupQueryAttention(
        HEAD_DIM,
        HEADS,
        KV_HEADS,
        rope_layout="interleaved",  # Llama 4 rotates complex pairs (2k, 2k + 1)
        attention_chunk_size=CHUNK,
        use_bias=False,
    )
    nope = RotaryGroupQueryAttention(
        HEAD_DIM,
        HEADS,
        KV_HEADS,
        rope_dim=0,
        query_temperature=attention_temperature(CONFIG),
        use_bias=False,
    )
    for layer, source in zip((rope, nope), torch_layers, strict=True):
        _copy_weights(layer, source)
    return rope, nope


def _copy_weights(layer, source) -> None:
    x = np.zeros((1, 1, HIDDEN), np.float32)
    layer(x, x)

    def kernel(linear, heads):
        return linear.weight.detach().numpy().T.reshape(HIDDEN, heads, HEAD_DIM)

    output = source.o_proj.weight.detach().numpy().T.reshape(HEADS, HEAD_DIM, HIDDEN)
    layer.set_weights(
        [
            kernel(source.q_proj, HEADS),
            kernel(source.k_proj, KV_HEADS),
            kernel(source.v_proj, KV_HEADS),
            output,
        ]
    )


def test_from_transformers_config_gives_each_layer_its_transformers_attention():
    torch_layers, torch_step = _torch_side()
    x = np.random.default_rng(3).normal(size=(2, 7, HIDDEN)).astype(np.float32)
    expected = torch_step(x, 0)  # 7 tokens: chunks of 3 and temperature steps of 2 matter
    exact = torch_step.exact(x)
    for index, (layer_type, source) in enumerate(
        zip(("chunked_attention", "full_attention"), torch_layers, strict=True)
    ):
        layer = RotaryGroupQueryAttention.from_transformers_config(
            CONFIG, layer_index=index, use_bias=False
        )
        _copy_weights(layer, source)
        output = layer(x, x, use_causal_mask=True)
        assert_within_bound(output, *exact[index])
        assert_within_bound(expected[index], *exact[index])
        # Here each layer type is RoPE or NoPE throughout: the type alone says which.
        assert attention_arguments(CONFIG, layer_type) == attention_arguments(
            CONFIG, layer_index=index
        )


@pytest.mark.parametrize(
    "config, arguments, message",
    [
        # No chunking: every layer is full_attention, with or without RoPE.
        ({**CONFIG, "attention_chunk_size": None}, {}, "pass layer_index="),
        ({**CONFIG, "attention_chunk_size": None}, {"layer_type": "full_attention"}, "rope_per"),
        ({"model_type": "smollm3", "hidden_size": 32, "num_attention_heads": 4}, {}, "layer_index"),
        (CONFIG, {"layer_index": 2}, "layer_index=2 is not a layer of this config"),
        (CONFIG, {"layer_index": 1, "layer_type": "chunked_attention"}, "layer 1 is full_att"),
    ],
)
def test_from_transformers_config_refuses_a_layer_it_cannot_know(config, arguments, message):
    with pytest.raises(ValueError, match=message):
        RotaryGroupQueryAttention.from_transformers_config(config, **arguments)


def test_smollm3_nope_layers_come_from_their_index():
    config = {"model_type": "smollm3", "hidden_size": 32, "num_attention_heads": 4}
    config |= {"num_hidden_layers": 4, "no_rope_layers": [1, 0, 1, 1]}
    dims = [
        RotaryGroupQueryAttention.from_transformers_config(config, layer_index=i).get_config()
        for i in range(4)
    ]
    assert [d["rope_dim"] for d in dims] == [None, 0, None, None]
    assert {d["query_temperature"] for d in dims} == {None}  # Llama 4's alone


def test_chunked_and_tempered_attention_match_transformers_with_a_cache():
    torch_layers, torch_step = _torch_side()
    layers = _keras_layers(torch_layers)
    x = np.random.default_rng(1).normal(size=(2, 7, HIDDEN)).astype(np.float32)
    caches = [np.zeros((2, 2, MAX_LENGTH, KV_HEADS, HEAD_DIM), np.float32) for _ in layers]
    whole = torch_step.exact(x)  # per layer (output, bound) of the 7 tokens
    exact = [(value[:, :5], bound[:, :5]) for value, bound in whole]
    rows = {
        start: [(value[:, start:stop], bound[:, start:stop]) for value, bound in whole]
        for start, stop in ((0, 5), (5, 6), (6, 7))
    }
    # The prefill ends inside chunk 1; step 5 stays there, step 6 opens chunk 2.
    for start, stop in ((0, 5), (5, 6), (6, 7)):
        expected = torch_step(x[:, start:stop], start)
        for i, layer in enumerate(layers):
            output, caches[i] = layer(
                x[:, start:stop],
                x[:, start:stop],
                use_causal_mask=True,
                cache=caches[i],
                cache_update_index=start,
            )
            assert_within_bound(output, *rows[start][i])
            assert_within_bound(expected[i], *rows[start][i])
        if start == 0:  # the prefill without a cache too, and the options change it
            for layer, prefill in zip(layers, exact, strict=True):
                full = layer(x[:, :5], x[:, :5], use_causal_mask=True)
                assert_within_bound(full, *prefill)
            # Without the option each layer is another attention: the test can fail.
            unchunked = RotaryGroupQueryAttention(
                HEAD_DIM, HEADS, KV_HEADS, rope_layout="interleaved", use_bias=False
            )
            untempered = RotaryGroupQueryAttention(
                HEAD_DIM, HEADS, KV_HEADS, rope_dim=0, use_bias=False
            )
            for layer, without, want in zip(layers, (unchunked, untempered), expected, strict=True):
                without(x[:, :1], x[:, :1])
                without.set_weights(layer.get_weights())
                differs = without(x[:, :5], x[:, :5], use_causal_mask=True) - want
                assert np.abs(differs).max() > 1e-3


def test_chunks_of_a_left_padded_row_start_at_its_first_token_as_in_transformers():
    torch_layers, torch_step = _torch_side()
    layers = _keras_layers(torch_layers)
    x = np.random.default_rng(2).normal(size=(2, 7, HIDDEN)).astype(np.float32)
    padding = np.ones((2, MAX_LENGTH), bool)
    padding[0, :2] = False  # row 0: 2 padding tokens, then its chunks 2-4 and 5-7
    caches = [np.zeros((2, 2, MAX_LENGTH, KV_HEADS, HEAD_DIM), np.float32) for _ in layers]
    exact = torch_step.exact(x, padding)
    for start, stop in ((0, 5), (5, 6), (6, 7)):
        expected = torch_step(x[:, start:stop], start, padding)
        real = padding[:, start:stop]  # padding queries attend to nothing: not compared
        for i, layer in enumerate(layers):
            tokens = x[:, start:stop]
            output, caches[i] = layer(
                tokens,
                tokens,
                use_causal_mask=True,
                cache=caches[i],
                cache_update_index=start,
                cache_mask=padding,
            )
            value, bound = (t[:, start:stop] for t in exact[i])
            assert_within_bound(output, value, bound, where=real)
            assert_within_bound(expected[i], value, bound, where=real)
            if start == 0:
                masks = {"query_mask": padding[:, :5], "value_mask": padding[:, :5]}
                full = layer(tokens, tokens, use_causal_mask=True, **masks)
                assert_within_bound(full, value, bound, where=real)


def _causal(steps: int, start: int, sources: int, first_key: int = 0) -> np.ndarray:
    """`(1, steps, sources)`: query `start + i` sees key `first_key + j` at or before it."""
    query, key = np.arange(start, start + steps), np.arange(first_key, first_key + sources)
    return (key[None, :] <= query[:, None])[None]


def test_chunks_without_a_cache_count_from_the_start_indices():
    # Queries 4-6 of 7 tokens, keys 0-6: chunks {0-2} {3-5} {6}, from query_start_index.
    torch_layers, torch_step = _torch_side()
    layers = _keras_layers(torch_layers)
    x = np.random.default_rng(3).normal(size=(2, 7, HIDDEN)).astype(np.float32)
    expected = torch_step(x, 0)
    for layer, want, (value, bound) in zip(layers, expected, torch_step.exact(x), strict=True):
        rows = layer(x[:, 4:], x, query_start_index=4, attention_mask=_causal(3, 4, 7))
        assert_within_bound(rows, value[:, 4:], bound[:, 4:])
        assert_within_bound(want[:, 4:], value[:, 4:], bound[:, 4:])


@pytest.mark.parametrize("temperature", [None, {"floor_scale": 2, "attn_scale": 0.5}])
def test_chunked_self_attention_on_a_slice_counts_chunks_from_its_start(temperature):
    # Tokens 4-6 alone, both starting at index 4: chunks {4, 5} and {6}, as in the full
    # call of tokens 0-6 with the keys before 4 masked out.
    layer = RotaryGroupQueryAttention(
        HEAD_DIM, HEADS, KV_HEADS, attention_chunk_size=CHUNK, query_temperature=temperature
    )
    x = np.random.default_rng(4).normal(size=(2, 7, HIDDEN)).astype(np.float32)
    full = layer(x, x, attention_mask=_causal(7, 0, 7) & (np.arange(7) >= 4))
    part = x[:, 4:]
    rows = layer(part, part, query_start_index=4, key_start_index=4, use_causal_mask=True)
    np.testing.assert_allclose(rows, full[:, 4:], rtol=0, atol=1e-5)


def test_the_options_round_trip_and_bad_ones_are_refused():
    layer = RotaryGroupQueryAttention(
        HEAD_DIM,
        HEADS,
        KV_HEADS,
        rope_dim=0,
        query_temperature={"floor_scale": 4, "attn_scale": 0.25},
        attention_chunk_size=CHUNK,
    )
    config = layer.get_config()
    assert config["query_temperature"] == {"floor_scale": 4, "attn_scale": 0.25}
    assert (config["attention_chunk_size"], config["rope_dim"]) == (CHUNK, 0)
    assert RotaryGroupQueryAttention.from_config(config).get_config() == config
    # A decoder block of a NoPE layer keeps it through its config.
    block = DecoderBlock(HEAD_DIM, HEADS, KV_HEADS, 16, rope_dim=0)
    assert DecoderBlock.from_config(block.get_config()).attention.rotary_embedding is None
    with pytest.raises(ValueError, match="attention_chunk_size=0"):
        RotaryGroupQueryAttention(HEAD_DIM, HEADS, KV_HEADS, attention_chunk_size=0)
    with pytest.raises(TypeError, match="query_temperature must be an AttentionTemperature"):
        RotaryGroupQueryAttention(HEAD_DIM, HEADS, KV_HEADS, query_temperature=8192)
    with pytest.raises(ValueError, match="rope_dim=0 makes a NoPE layer"):
        RotaryGroupQueryAttention(HEAD_DIM, HEADS, KV_HEADS, rope_dim=0, rope_layout="interleaved")


def test_a_llama4_decode_step_exports_to_onnx_and_verifies(tmp_path):
    tokens = keras.Input((None, HIDDEN), name="tokens")
    outputs, inputs = {}, [tokens]
    index = keras.Input(batch_shape=(), dtype="int32", name="index")
    options = {
        "rope": {"attention_chunk_size": CHUNK},
        "nope": {"rope_dim": 0, "query_temperature": {"floor_scale": 2, "attn_scale": 0.5}},
    }
    for name, extra in options.items():
        cache = keras.Input((2, MAX_LENGTH, KV_HEADS, HEAD_DIM), name=f"{name}_cache")
        layer = RotaryGroupQueryAttention(HEAD_DIM, HEADS, KV_HEADS, **extra)
        outputs[name], outputs[f"{name}_new_cache"] = layer(
            tokens, tokens, use_causal_mask=True, cache=cache, cache_update_index=index
        )
        inputs.append(cache)
    model = keras.Model([*inputs, index], outputs)
    path = kpe.save_onnx(model, tmp_path / "step.onnx")
    report = kpe.verify_export(
        model, onnx_path=path, batch_sizes=(1, 2), sequence_lengths=(1, 3), repeats=1
    )
    assert report["passed"]
    assert report["summary"]["onnxruntime"]["max_abs_error"] <= 1e-5
