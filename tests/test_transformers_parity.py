"""`from_transformers_config` against transformers itself, at the query and key level.

For each family, a tiny random transformers model is built from a config (no download), its
first attention layers run, and the queries and keys going into and coming out of the
family's own `apply_rotary_pos_emb` are captured. Our `RotaryEmbedding`, made from the same
config, applied to the captured inputs must give the captured outputs (<= 1e-5): for a
plain batch, a left-padded batch with positions from the mask, and one decoding step past
the original context. The config reaches the reader in three forms (the raw dict a
config.json holds, the config object, its `to_dict()`), which must give the same layer.
"""

from __future__ import annotations

import copy
import dataclasses
import importlib

import numpy as np
import pytest
import torch
import transformers
from float32_error import assert_within_bound, torch_frequency_error
from test_transformers_config import PUBLISHED
from test_transformers_parity_2026 import CASES as CASES_2026
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from keras_posenc import RotaryEmbedding
from keras_posenc.configs.arguments import attention_arguments, rotary_arguments
from keras_posenc.configs.families import FAMILIES
from keras_posenc.rope import rope_parameters

torch.manual_seed(0)
SIZES = {
    "vocab_size": 64,
    "hidden_size": 64,
    "intermediate_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "num_hidden_layers": 1,
    "max_position_embeddings": 64,
    "pad_token_id": 0,
}
LENGTH = 8
DECODE_POSITION = 100  # past every max_position_embeddings / original length below
PAIRS = 8  # longrope factors for a 16-channel head


@dataclasses.dataclass
class Case:
    model_type: str
    raw: dict  # the config.json keys besides the sizes
    sequence_axis: int = 2  # of the tensors apply_rotary_pos_emb sees
    function: str = "apply_rotary_pos_emb"
    # DeepSeek-V3 returns the rotated pairs de-interleaved (evens, then odds).
    deinterleaved_output: bool = False
    layer_types: tuple[str, ...] = (None,)
    sizes: dict = dataclasses.field(default_factory=lambda: dict(SIZES))


def _ramp(start, step, count=PAIRS):
    return [start + step * k for k in range(count)]


LONGROPE = {"type": "longrope", "short_factor": _ramp(1.0, 0.1), "long_factor": _ramp(1.0, 0.7)}
GEMMA_TYPES = ("sliding_attention", "full_attention")
CASES = {
    "llama": Case("llama", {"rope_theta": 500000.0}),
    "llama-linear": Case("llama", {"rope_scaling": {"type": "linear", "factor": 2.0}}),
    "llama-dynamic": Case("llama", {"rope_scaling": {"type": "dynamic", "factor": 2.0}}),
    "llama3.1": Case(
        "llama",
        {
            "rope_theta": 500000.0,
            "max_position_embeddings": 256,
            "rope_scaling": {
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 32,
            },
        },
    ),
    "mistral": Case("mistral", {"head_dim": 16, "rope_theta": 1e6, "sliding_window": 4096}),
    "mixtral": Case("mixtral", {"num_local_experts": 2, "num_experts_per_tok": 1}),
    "qwen2.5-yarn": Case(
        "qwen2",
        {
            "rope_theta": 1e6,
            "rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32},
        },
    ),
    "qwen2_moe": Case("qwen2_moe", {"num_experts": 2, "num_experts_per_tok": 1}),
    "qwen3": Case("qwen3", {"head_dim": 16, "rope_theta": 1e6}),
    "qwen3_moe": Case("qwen3_moe", {"head_dim": 16, "num_experts": 2, "num_experts_per_tok": 1}),
    "phi3-128k-longrope": Case(
        "phi3",
        {
            "max_position_embeddings": 128,
            "original_max_position_embeddings": 32,
            "rope_scaling": LONGROPE,
        },
    ),
    "phi4-mini-partial-longrope": Case(
        "phi3",
        {
            "max_position_embeddings": 128,
            "original_max_position_embeddings": 32,
            "partial_rotary_factor": 0.75,
            "rope_scaling": {
                **LONGROPE,
                "short_factor": _ramp(1.0, 0.1, 6),
                "long_factor": _ramp(1.0, 0.7, 6),
            },
        },
    ),
    "phi": Case("phi", {"partial_rotary_factor": 0.5}),
    "gemma": Case("gemma", {"head_dim": 16}),
    "gemma2": Case("gemma2", {"head_dim": 16}),
    "gemma3": Case(
        "gemma3_text",
        {
            "head_dim": 16,
            "rope_theta": 1e6,
            "rope_local_base_freq": 1e4,
            "rope_scaling": {"rope_type": "linear", "factor": 8.0},
            "layer_types": list(GEMMA_TYPES),
        },
        layer_types=GEMMA_TYPES,
    ),
    "pythia": Case("gpt_neox", {"rotary_pct": 0.25, "rotary_emb_base": 1e6}),
    "stablelm": Case("stablelm", {"partial_rotary_factor": 0.25}),
    "modernbert": Case(
        "modernbert",
        {
            "global_rope_theta": 160000.0,
            "local_rope_theta": 1e4,
            "layer_types": list(GEMMA_TYPES),
            "max_position_embeddings": 128,
        },
        layer_types=GEMMA_TYPES,
    ),
    "olmo2": Case("olmo2", {}),
    "granite": Case("granite", {}),
    "starcoder2": Case("starcoder2", {}),
    "cohere": Case("cohere", {}),
    "glm": Case("glm", {"head_dim": 16, "partial_rotary_factor": 0.5}),
    "glm4": Case("glm4", {"head_dim": 16}),
    "gpt-j": Case(
        "gptj",
        {"rotary_dim": 8},
        sequence_axis=1,
        sizes={
            "vocab_size": 64,
            "n_embd": 64,
            "n_head": 4,
            "n_layer": 1,
            "n_positions": 128,
            "pad_token_id": 0,
        },
    ),
    "codegen": Case(
        "codegen",
        {"rotary_dim": 8},
        sequence_axis=1,
        sizes={
            "vocab_size": 64,
            "n_embd": 64,
            "n_head": 4,
            "n_layer": 1,
            "n_positions": 128,
            "pad_token_id": 0,
        },
    ),
    "deepseek-v3-yarn": Case(
        "deepseek_v3",
        {
            "num_key_value_heads": 4,  # multi-head latent attention: one per head
            "kv_lora_rank": 16,
            "q_lora_rank": 32,
            "qk_rope_head_dim": 16,
            "qk_nope_head_dim": 16,
            "v_head_dim": 16,
            "first_k_dense_replace": 1,
            "n_routed_experts": 2,
            "num_experts_per_tok": 1,
            "n_group": 1,
            "topk_group": 1,
            "max_position_embeddings": 256,
            "rope_scaling": {
                "type": "yarn",
                "factor": 8.0,
                "original_max_position_embeddings": 32,
                "beta_fast": 32,
                "beta_slow": 1,
                "mscale": 1.0,
                "mscale_all_dim": 0.8,
            },
        },
        function="apply_rotary_pos_emb_interleave",
        deinterleaved_output=True,
    ),
}


def test_every_family_of_the_reader_has_a_parity_case():
    # Multimodal RoPE families are run side by side in tests/test_axes.py; the 2026
    # families (Qwen3.5's M-RoPE among them, on text), layer by layer in
    # tests/test_transformers_parity_2026.py.
    one_axis = {name for name, family in FAMILIES.items() if family.mrope is None}
    here = {case.model_type for case in CASES.values()}
    per_layer = {case.model_type for case in CASES_2026.values()}
    assert not here & per_layer
    assert one_axis <= here | per_layer <= set(FAMILIES)


# The families of this file's cases; the 2026 ones have their own tests of the same.
ONE_LAYER = sorted({case.model_type for case in CASES.values()})


class Capture:
    """Records (input, output) tensor pairs of a modeling module's RoPE function."""

    def __init__(self, module, name):
        self.module, self.name = module, name
        self.original = getattr(module, name)
        self.calls = []

    def __enter__(self):
        def wrapper(*args, **kwargs):
            out = self.original(*args, **kwargs)
            if isinstance(out, torch.Tensor):  # GPT-J / CodeGen: one tensor per call
                self.calls.append([(args[0], out)])
            else:
                self.calls.append([(args[0], out[0]), (args[1], out[1])])
            return out

        setattr(self.module, self.name, wrapper)
        return self

    def __exit__(self, *exc):
        setattr(self.module, self.name, self.original)


def _numpy(tensor, sequence_axis):
    # To (batch, sequence, heads, channels).
    array = tensor.detach().double().numpy().astype(np.float32)
    return np.moveaxis(array, sequence_axis, 1) if sequence_axis != 1 else array


def _rope_calls(case, config, model, ids, mask=None, position_ids=None):
    module = importlib.import_module(type(model).__module__)
    with Capture(module, case.function) as capture, torch.no_grad():
        model(input_ids=ids, attention_mask=mask, position_ids=position_ids)
    per_call = 2 if case.model_type in ("gptj", "codegen") else 1  # k, then q
    return [
        sum(capture.calls[i : i + per_call], []) for i in range(0, len(capture.calls), per_call)
    ]


def _our_rotation(layer, pre, positions_mask=None, start_index=0):
    return layer(pre, mask=positions_mask, start_index=start_index).numpy()


def _close(case, ours, theirs, rows=slice(None)):
    if case.deinterleaved_output:
        ours = np.concatenate([ours[..., 0::2], ours[..., 1::2]], -1)
    difference = np.abs(ours[:, rows] - theirs[:, rows]).max()
    assert difference <= 1e-5, difference


def _attention_or_refusal(config, layer_type):
    """`attention_arguments`, or its error's message where the attention has a setting the
    layers do not compute (Gemma 2's soft cap, Gemma 3's query_pre_attn_scalar, ...): a raw
    config and a config object must read, or be refused, alike."""
    try:
        return attention_arguments(config, layer_type)
    except ValueError as error:
        return f"refused: {error}"


@pytest.mark.parametrize("name", sorted(CASES))
def test_queries_and_keys_equal_transformers(name):
    case = CASES[name]
    raw = {"model_type": case.model_type, **case.sizes, **case.raw}
    if case.layer_types != (None,):
        raw["num_hidden_layers"] = len(case.layer_types)
    config = transformers.AutoConfig.for_model(**raw)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    model = transformers.AutoModel.from_config(config, attn_implementation="eager").eval()

    layers = []
    for layer_type in case.layer_types:
        forms = [rotary_arguments(form, layer_type) for form in (raw, config, config.to_dict())]
        assert forms[0] == forms[1] == forms[2], forms
        if case.model_type != "deepseek_v3":
            heads = [_attention_or_refusal(form, layer_type) for form in (raw, config)]
            assert heads[0] == heads[1], heads
        layer = RotaryEmbedding.from_transformers_config(
            raw, layer_type=layer_type, positions_from_mask=True
        )
        layers.append(layer)

    rng = np.random.default_rng(0)
    ids = torch.tensor(rng.integers(1, 64, (2, LENGTH)))
    # A plain batch.
    for layer, call in zip(layers, _rope_calls(case, config, model, ids), strict=True):
        for pre, post in call:
            pre, post = _numpy(pre, case.sequence_axis), _numpy(post, case.sequence_axis)
            _close(case, _our_rotation(layer, pre), post)

    # A left-padded batch: row 0 has three pads; positions from the mask, as generate() does.
    mask = torch.ones((2, LENGTH), dtype=torch.long)
    mask[0, :3] = 0
    position_ids = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 1)
    calls = _rope_calls(case, config, model, ids, mask, position_ids)
    for layer, call in zip(layers, calls, strict=True):
        for pre, post in call:
            pre, post = _numpy(pre, case.sequence_axis), _numpy(post, case.sequence_axis)
            ours = _our_rotation(layer, pre, positions_mask=mask.numpy().astype(bool))
            _close(case, ours[:1], post[:1], rows=slice(3, None))  # the padded row's tokens
            _close(case, ours[1:], post[1:])

    # One decoding step past the original context (scaling types switch or grow there).
    step = torch.tensor([[DECODE_POSITION]])
    calls = _rope_calls(case, config, model, ids[:1, :1], position_ids=step)
    for layer, call in zip(layers, calls, strict=True):
        for pre, post in call:
            pre, post = _numpy(pre, case.sequence_axis), _numpy(post, case.sequence_axis)
            _close(case, _our_rotation(layer, pre, start_index=DECODE_POSITION), post)


@pytest.mark.parametrize("model_type", ONE_LAYER)
def test_keys_a_config_leaves_out_get_transformers_defaults(model_type):
    """A config.json with only the sizes reads as transformers' config class fills it in."""
    case = next(case for case in CASES.values() if case.model_type == model_type)
    raw = {"model_type": model_type, **case.sizes}
    if model_type in ("gptj", "codegen"):
        raw["n_embd"] = 512  # heads of 128 channels, for their default rotary_dim 64
    if model_type == "deepseek_v3":
        raw["num_key_value_heads"] = 4
    config = transformers.AutoConfig.for_model(**raw)
    types = [None]
    if model_type in ("gemma3_text", "modernbert"):
        types = ["full_attention", "sliding_attention"]
    for layer_type in types:
        assert rotary_arguments(raw, layer_type) == rotary_arguments(config, layer_type)
        assert rotary_arguments(raw, layer_type) == rotary_arguments(config.to_dict(), layer_type)
        if model_type != "deepseek_v3":  # multi-head latent attention: no attention arguments
            assert _attention_or_refusal(raw, layer_type) == _attention_or_refusal(
                config, layer_type
            )


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_published_configs_read_as_transformers_reads_them(name):
    """The real-size config.json formats: same arguments, and the frequencies transformers makes."""
    raw, layer_type, _ = PUBLISHED[name]
    config = transformers.AutoConfig.for_model(**copy.deepcopy(raw))
    assert rotary_arguments(config, layer_type) == rotary_arguments(raw, layer_type)
    text = getattr(config, "text_config", None) or config
    parameters = getattr(text, "rope_parameters", None) or {}
    if layer_type is not None:
        parameters = parameters[layer_type]
    if parameters.get("rope_type", "default") == "default":
        return
    arguments = rotary_arguments(raw, layer_type)
    head_dim = (
        attention_arguments(raw, layer_type)["head_dim"]
        if raw["model_type"] != "deepseek_v3"
        else raw["qk_rope_head_dim"]
    )
    rotary_dim = arguments["rotary_dim"] or head_dim
    ours = rope_parameters(rotary_dim, arguments["max_wavelength"], arguments["scaling"])
    init = ROPE_INIT_FUNCTIONS[parameters["rope_type"]]
    theirs, attention_factor = init(text, "cpu", layer_type=layer_type)
    theirs = theirs.double().numpy()
    assert_within_bound(ours.inverse_frequencies, theirs, torch_frequency_error(theirs, True))
    assert ours.attention_factor == pytest.approx(attention_factor, rel=1e-12)


# Families whose own key replaces the generic `partial_rotary_factor` (transformers ignores a
# top-level one there); the reader names both instead of reading either way.
OWN_PARTIAL_KEY = {"gpt_neox": "rotary_pct"}


def _first_rope_call(case, raw):
    config = transformers.AutoConfig.for_model(**copy.deepcopy(raw))
    torch.manual_seed(0)
    model = transformers.AutoModel.from_config(config, attn_implementation="eager").eval()
    ids = torch.tensor(np.random.default_rng(0).integers(1, 64, (2, LENGTH)))
    return config, _rope_calls(case, config, model, ids)


@pytest.mark.parametrize("model_type", ONE_LAYER)
def test_a_top_level_partial_rotary_factor_is_read_as_transformers_reads_it(model_type):
    """Most families' attention rotates the whole head whatever partial_rotary_factor says."""
    case = next(case for case in CASES.values() if case.model_type == model_type)
    own = {"rope_scaling", "rotary_pct", "partial_rotary_factor"}
    raw = {"model_type": model_type, **case.sizes}
    raw.update({key: value for key, value in case.raw.items() if key not in own})
    raw["partial_rotary_factor"] = 0.5
    if case.layer_types != (None,):
        raw["num_hidden_layers"] = len(case.layer_types)
    if model_type in OWN_PARTIAL_KEY:
        with pytest.raises(
            ValueError, match=f"partial_rotary_factor.*{OWN_PARTIAL_KEY[model_type]}"
        ):
            rotary_arguments(raw)
        return
    config, calls = _first_rope_call(case, raw)
    for layer_type, call in zip(case.layer_types, calls, strict=True):
        forms = [rotary_arguments(form, layer_type) for form in (raw, config, config.to_dict())]
        assert forms[0] == forms[1] == forms[2], forms
        layer = RotaryEmbedding.from_transformers_config(raw, layer_type=layer_type)
        for pre, post in call:
            pre, post = _numpy(pre, case.sequence_axis), _numpy(post, case.sequence_axis)
            _close(case, _our_rotation(layer, pre), post)


@pytest.mark.parametrize(
    "model_type, scaling",
    [
        ("llama", {"type": "linear", "factor": 2.0}),
        ("qwen2", {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32}),
        ("cohere", {"type": "dynamic", "factor": 2.0}),
        ("gemma3_text", {"rope_type": "linear", "factor": 8.0}),
    ],
)
def test_partial_rotary_factor_with_scaling_where_transformers_fails_is_refused(
    model_type, scaling
):
    """Scaled frequencies read the factor, the whole-head attention does not: transformers fails."""
    case = next(case for case in CASES.values() if case.model_type == model_type)
    raw = {"model_type": model_type, **case.sizes, **case.raw}
    raw.update({"partial_rotary_factor": 0.5, "rope_scaling": scaling})
    if case.layer_types != (None,):
        raw["num_hidden_layers"] = len(case.layer_types)
    with pytest.raises(RuntimeError, match="size of tensor"):
        _first_rope_call(case, raw)
    layer_type = "full_attention" if case.layer_types != (None,) else None
    with pytest.raises(ValueError, match="partial_rotary_factor.*remove it") as error:
        rotary_arguments(raw, layer_type)
    assert len(str(error.value)) < 400


PHI3_SIZES = {**SIZES, "max_position_embeddings": 128}
PHI3_FACTORS = {"short_factor": _ramp(1.0, 0.1), "long_factor": _ramp(1.0, 0.7)}


@pytest.mark.parametrize(
    "rope_scaling, top",
    [
        ({"type": "longrope", "original_max_position_embeddings": 32}, {}),
        ({"type": "longrope"}, {}),
        ({"type": "su", "original_max_position_embeddings": 32}, {}),
        (
            {"type": "su", "original_max_position_embeddings": 32},
            {"original_max_position_embeddings": 16},
        ),
        ({"type": "yarn", "original_max_position_embeddings": 32}, {}),
    ],
)
def test_phi3_original_length_is_the_one_transformers_uses(rope_scaling, top):
    """Phi3Config's top-level original_max_position_embeddings (default 4096) always wins."""
    raw = {"model_type": "phi3", **PHI3_SIZES, **top}
    raw["rope_scaling"] = {**rope_scaling, **PHI3_FACTORS}
    config = transformers.AutoConfig.for_model(**copy.deepcopy(raw))
    forms = [rotary_arguments(form) for form in (raw, config, config.to_dict())]
    assert forms[0] == forms[1] == forms[2], forms
    # The model's rotary module standardizes its config again, after the "su" renaming.
    model = transformers.AutoModel.from_config(config).eval()
    used = model.config.rope_parameters["original_max_position_embeddings"]
    assert forms[0]["scaling"]["original_max_position_embeddings"] == used
    ours = rope_parameters(16, forms[0]["max_wavelength"], forms[0]["scaling"])
    assert ours.attention_factor == pytest.approx(model.rotary_emb.attention_scaling, rel=1e-12)


@pytest.mark.parametrize("top", [{}, {"original_max_position_embeddings": 32}])
def test_phi3_su_without_its_own_original_length_is_refused_as_transformers_does(top):
    raw = {
        "model_type": "phi3",
        **PHI3_SIZES,
        **top,
        "rope_scaling": {"type": "su", **PHI3_FACTORS},
    }
    with pytest.raises(KeyError, match="original_max_position_embeddings"):
        transformers.AutoConfig.for_model(**copy.deepcopy(raw))
    with pytest.raises(ValueError, match="'su'.*original_max_position_embeddings") as error:
        rotary_arguments(raw)
    assert len(str(error.value)) < 400
