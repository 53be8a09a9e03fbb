"""`rope_per_layer` against transformers for the 2026 families, layer by layer.

As tests/test_transformers_parity.py, at the query and key level: a tiny random transformers
model is built once per case from a config (no download) with a few decoder layers covering
the family's schedule (RoPE per layer type, NoPE, linear attention, convolution); the
queries and keys going into and out of its RoPE function are captured per decoder layer.
`rope_per_layer(config)` must give None exactly for the layers that make no RoPE call, and,
for the others, a `RotaryEmbedding` that turns the captured inputs into the captured outputs
(<= 1e-5) for a prefill from position 0 and a decoding step with the prefill's cache at a
position past the original context.
"""

from __future__ import annotations

import dataclasses
import importlib

import numpy as np
import pytest
import torch
import transformers

from keras_posenc import rope_per_layer
from keras_posenc.configs.arguments import rotary_arguments

LENGTH = 8
DECODE_POSITION = 100  # past every original context below (as test_transformers_parity.py)
SIZES = {
    "vocab_size": 64,
    "hidden_size": 64,
    "intermediate_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": 128,
    "pad_token_id": 0,
}
MOE = {"num_experts": 2, "num_experts_per_tok": 1, "moe_intermediate_size": 32}
LINEAR = {
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 2,
    "linear_key_head_dim": 8,
    "linear_value_head_dim": 8,
}


@dataclasses.dataclass
class Case:
    model_type: str
    raw: dict  # config.json keys besides SIZES
    sequence_axis: int = 2  # of the tensors the RoPE function sees
    function: str = "apply_rotary_pos_emb"
    deinterleaved_output: bool = False  # DeepSeek: rotated pairs come out evens, then odds
    expected_nope: tuple[int, ...] = ()  # layers without RoPE, as the config says


CASES = {
    "gemma4": Case(
        "gemma4_text",
        {
            "num_hidden_layers": 2,
            "layer_types": ["sliding_attention", "full_attention"],
            "global_head_dim": 32,
            "vocab_size_per_layer_input": 64,
            "hidden_size_per_layer_input": 8,
            "sliding_window": 16,
        },
        sequence_axis=1,
    ),
    "llama4": Case(
        "llama4_text",
        {
            "num_hidden_layers": 4,
            "intermediate_size_mlp": 64,
            "num_local_experts": 2,
            "num_experts_per_tok": 1,
            "attention_chunk_size": 16,
            "rope_theta": 500000.0,
            "rope_scaling": {
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 32,
            },
        },
        sequence_axis=1,
        function="apply_rotary_emb",
        expected_nope=(3,),
    ),
    "smollm3": Case("smollm3", {"num_hidden_layers": 4}, expected_nope=(3,)),
    "gpt-oss": Case(
        "gpt_oss",
        {
            "num_hidden_layers": 2,
            "num_local_experts": 2,
            "num_experts_per_tok": 1,
            "sliding_window": 16,
            "rope_scaling": {
                "rope_type": "yarn",
                "factor": 32.0,
                "beta_fast": 32.0,
                "beta_slow": 1.0,
                "truncate": False,
                "original_max_position_embeddings": 64,
            },
        },
    ),
    "qwen3-next": Case(
        "qwen3_next",
        {"num_hidden_layers": 2, "full_attention_interval": 2, **MOE, **LINEAR},
        expected_nope=(0,),
    ),
    "qwen3.5": Case(
        "qwen3_5_text",
        {
            "num_hidden_layers": 2,
            "layer_types": ["linear_attention", "full_attention"],
            "rope_parameters": {
                "rope_type": "default",
                "rope_theta": 1e7,
                "partial_rotary_factor": 0.5,
                "mrope_section": [1, 1, 2],
                "mrope_interleaved": True,
            },
            **LINEAR,
        },
        expected_nope=(0,),
    ),
    "qwen3.5-moe": Case(
        "qwen3_5_moe_text",
        {
            "num_hidden_layers": 2,
            "full_attention_interval": 2,
            "rope_parameters": {
                "rope_type": "default",
                "partial_rotary_factor": 0.5,
                "mrope_section": [2, 1, 1],
            },
            **MOE,
            **LINEAR,
        },
        expected_nope=(0,),
    ),
    "olmo3": Case(
        "olmo3",
        {
            "num_hidden_layers": 2,
            "layer_types": ["sliding_attention", "full_attention"],
            "sliding_window": 16,
            "rope_theta": 1e6,
            "rope_scaling": {
                "rope_type": "yarn",
                "factor": 4.0,
                "original_max_position_embeddings": 32,
                "attention_factor": 1.2,
            },
        },
    ),
    "exaone4": Case(
        "exaone4",
        {"num_hidden_layers": 4, "sliding_window": 16, "sliding_window_pattern": 4},
        expected_nope=(3,),
    ),
    "seed-oss": Case("seed_oss", {"num_hidden_layers": 1, "rope_theta": 1e7}),
    "ernie4.5": Case("ernie4_5", {"num_hidden_layers": 1}),
    "ernie4.5-moe": Case(
        "ernie4_5_moe",
        {"num_hidden_layers": 1, "moe_num_experts": 2, "moe_k": 1, "moe_intermediate_size": 32},
    ),
    "glm4-moe": Case(
        "glm4_moe",
        {
            "num_hidden_layers": 1,
            "n_routed_experts": 2,
            "num_experts_per_tok": 1,
            "n_group": 1,
            "topk_group": 1,
            "moe_intermediate_size": 32,
        },
    ),
    "hunyuan-dense-alpha": Case(
        "hunyuan_v1_dense",
        {
            "num_hidden_layers": 1,
            "rope_scaling": {"type": "dynamic", "alpha": 1000.0, "factor": 1.0},
        },
    ),
    "hunyuan-moe": Case(
        "hunyuan_v1_moe",
        {"num_hidden_layers": 1, "num_experts": 2, "moe_topk": 1},
    ),
    "apertus": Case("apertus", {"num_hidden_layers": 1}),
    "deepseek-v3.2": Case(
        "deepseek_v32",
        {
            "num_hidden_layers": 1,
            "num_key_value_heads": 4,
            "kv_lora_rank": 16,
            "q_lora_rank": 32,
            "qk_rope_head_dim": 8,
            "qk_nope_head_dim": 16,
            "v_head_dim": 16,
            "index_head_dim": 16,
            "index_n_heads": 2,
            "index_topk": 4,
            "n_routed_experts": 2,
            "num_experts_per_tok": 1,
            "n_group": 1,
            "topk_group": 1,
            "moe_intermediate_size": 32,
            "rope_scaling": {
                "type": "yarn",
                "factor": 8.0,
                "original_max_position_embeddings": 32,
                "mscale": 1.0,
                "mscale_all_dim": 0.8,
            },
        },
        function="apply_rotary_pos_emb_interleave",
        deinterleaved_output=True,
    ),
    "minimax-m2": Case(
        "minimax_m2",
        {"num_hidden_layers": 1, "rotary_dim": 8, "num_local_experts": 2, "num_experts_per_tok": 1},
    ),
    "lfm2": Case(
        "lfm2",
        {"num_hidden_layers": 2, "layer_types": ["conv", "full_attention"]},
        expected_nope=(0,),
    ),
    "lfm2-moe": Case(
        "lfm2_moe",
        {
            "num_hidden_layers": 2,
            "layer_types": ["conv", "full_attention"],
            "num_dense_layers": 1,
            **MOE,
        },
        expected_nope=(0,),
    ),
}


class LayerCapture:
    """(input, output) pairs of a modeling module's RoPE function, by decoder layer."""

    def __init__(self, model, function):
        self.model, self.function = model, function
        self.module = importlib.import_module(type(model).__module__)
        self.calls: dict[int, list] = {}

    def __enter__(self):
        original = getattr(self.module, self.function)
        self.original, current = original, [None]

        def wrapper(*args, **kwargs):
            out = original(*args, **kwargs)
            # Gemma 4 rotates one tensor per call; the others queries and keys together.
            single = isinstance(out, torch.Tensor)
            pairs = [(args[0], out)] if single else list(zip(args[:2], out, strict=True))
            self.calls.setdefault(current[0], []).extend(pairs)
            return out

        def enter(index):
            return lambda module, args: current.__setitem__(0, index)

        self.hooks = [
            layer.register_forward_pre_hook(enter(index))
            for index, layer in enumerate(self.model.layers)
        ]
        setattr(self.module, self.function, wrapper)
        return self

    def __exit__(self, *exc):
        setattr(self.module, self.function, self.original)
        for hook in self.hooks:
            hook.remove()


def _numpy(tensor, sequence_axis):
    array = tensor.detach().double().numpy().astype(np.float32)
    return np.moveaxis(array, sequence_axis, 1)  # to (batch, sequence, heads, channels)


@pytest.fixture(scope="module", params=sorted(CASES))
def built(request):
    """A case's raw config, config object, model and captured calls (prefill, decode)."""
    case = CASES[request.param]
    raw = {"model_type": case.model_type, **SIZES, **case.raw}
    config = transformers.AutoConfig.for_model(**raw)
    torch.manual_seed(0)
    model = transformers.AutoModel.from_config(config, attn_implementation="eager").eval()
    ids = torch.tensor(np.random.default_rng(0).integers(1, 64, (2, LENGTH)))
    runs = []
    # A prefill of the whole batch, then row 0 alone decodes one token against its cache, at
    # a position past the original context.
    with LayerCapture(model, case.function) as capture, torch.no_grad():
        prefill = model(input_ids=ids[:1], use_cache=True)
    runs.append(capture.calls)
    with LayerCapture(model, case.function) as capture, torch.no_grad():
        model(
            input_ids=ids[:1, :1],
            position_ids=torch.tensor([[DECODE_POSITION]]),
            cache=prefill.past_key_values,
            use_cache=True,
        )
    runs.append(capture.calls)
    assert prefill.past_key_values.get_seq_length() == LENGTH + 1  # the step used the cache
    return case, raw, config, runs


def _described(layers):
    return [None if r is None else {**r.get_config(), "name": None} for r in layers]


def test_rope_per_layer_equals_transformers(built):
    case, raw, config, runs = built
    layers = rope_per_layer(raw)
    assert len(layers) == config.num_hidden_layers
    for form in (config, config.to_dict()):
        assert _described(rope_per_layer(form)) == _described(layers)
    nope = tuple(index for index, layer in enumerate(layers) if layer is None)
    assert nope == case.expected_nope
    for calls, start in zip(runs, (0, DECODE_POSITION), strict=True):
        # The layers transformers rotates are exactly those we give a RotaryEmbedding.
        assert sorted(calls) == [i for i in range(len(layers)) if layers[i] is not None]
        for index, pairs in calls.items():
            for pre, post in pairs:
                pre, post = _numpy(pre, case.sequence_axis), _numpy(post, case.sequence_axis)
                ours = layers[index](pre, start_index=start).numpy()
                if case.deinterleaved_output:
                    ours = np.concatenate([ours[..., 0::2], ours[..., 1::2]], -1)
                difference = np.abs(ours - post).max()
                assert difference <= 1e-5, (index, start, difference)


def test_from_transformers_config_reads_each_layer_type(built):
    case, raw, config, _ = built
    types = getattr(config, "layer_types", None) or [None]
    for layer_type, layer in zip(types, rope_per_layer(raw), strict=False):
        if layer is not None:
            assert rotary_arguments(raw, layer_type) == rotary_arguments(config, layer_type)
