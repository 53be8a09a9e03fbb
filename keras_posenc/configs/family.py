"""The record of one transformers family: every default the readers take by `model_type`.

A family is one `Family` in `keras_posenc.configs.families.FAMILIES`: how its attention reads
RoPE, which layer types its config class makes, and its attention's biases, sliding window,
gate, dropout, q/k norm and the settings these layers refuse. Defaults are those of the
family's transformers 5 config class, behaviours those of its modeling code (checked against
transformers by `tests/test_transformers_parity.py` and `tests/test_attention_config_keys.py`).
The readers take a `Family`; none of them tests a `model_type`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping

FULL, SLIDING = "full_attention", "sliding_attention"

# `(config, num_hidden_layers) -> layer types`: what a config class makes when a config has none.
LayerTypes = Callable[[dict, int], "list[str] | None"]
# `(config, num_hidden_layers, sliding window or None) -> layer types`, for the window alone.
WindowTypes = Callable[[dict, int, "int | None"], "list[str]"]
# `(config, model_type, head_dim)`: raises ValueError for a setting these layers do not compute.
AttentionCheck = Callable[[dict, str, int], None]


@dataclasses.dataclass(frozen=True)
class Norm:
    """A family's query / key norm, as its attention module applies it.

    Attributes:
        kind: a key of `keras_posenc.layers.query_key_norm.QUERY_KEY_NORMS`.
        epsilon_key: the config key of its epsilon.
        epsilon: that key's default in the config class.
        flag: `(config key, its default)` where the norm is optional.
        rope_layers_only: not in NoPE layers (Llama 4).
    """

    kind: str
    epsilon_key: str = "rms_norm_eps"
    epsilon: float = 1e-6
    flag: tuple[str, bool] | None = None
    rope_layers_only: bool = False


@dataclasses.dataclass(frozen=True)
class Window:
    """A family's sliding window, as its config class and attention module read it.

    Attributes:
        layers: `"every"` (every layer: Mistral, Phi-3, ...) or `"sliding"` (its
            `sliding_attention` layers).
        default: its config class's `sliding_window` (None: none unless a config sets one).
        needs_flag: the window is read only with `use_sliding_window` true (its config class
            nulls it otherwise: Qwen2, SmolLM3, ...).
        types: the layer types its config class makes for the window when a config lists
            none (Qwen2's `max_window_layers`, Gemma 2's alternation); None: the family's
            `layer_types`.
        local_attention: ModernBERT's default `local_attention`: its sliding layers attend
            bidirectionally within `local_attention // 2` tokens on either side, which these
            layers refuse.
    """

    layers: str = "sliding"
    default: int | None = None
    needs_flag: bool = False
    types: WindowTypes | None = None
    local_attention: int | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class Family:
    """How transformers reads one `model_type`: its RoPE, its layers and its attention.

    Only `bias` has no default: every family's attention has a bias rule.

    RoPE attributes:
        layout: `"half"` or `"interleaved"` channel pairing of its attention.
        theta: its default `rope_theta`, or one per layer type.
        partial: its default `partial_rotary_factor`.
        reads_partial: whether its attention applies `partial_rotary_factor`. Where not
            (most families: their modeling code never reads it), the whole head rotates: a
            factor leaves their default frequencies as they are, and makes the scaled ones,
            which the shared rope functions compute for `head_dim * factor` channels, too few
            for the head (the transformers model fails).
        legacy: transformers-4 keys it reads, mapped to `(layer type or None, rope key)`.
        scaling_types: the layer types a transformers-4 `rope_scaling` applies to (None: all).
        fixed: the family's code takes no RoPE keys but `rotary_dim` (GPT-J, CodeGen).
        head_dim: its default `head_dim` (None: `hidden_size // num_attention_heads`).
        original_length: its config class's default top-level
            `original_max_position_embeddings`, which replaces the rope parameters' own for
            llama3 / yarn / longrope frequencies (Phi-3: the attribute is always set).
        longrope_aliases: its config class renames rope type `"su"` / `"yarn"` to
            `"longrope"` (Phi-3).
        mrope: its multimodal RoPE's default `mrope_section` (None: 1D RoPE).
        mrope_interleaved: whether its M-RoPE interleaves the axes (Qwen3-VL) or chunks
            them (Qwen2-VL); fixed by the family's code, whatever the config says.
        defaults: the rope parameters its config class sets when a config gives none
            (GPT-OSS's yarn, Apertus's llama3, Gemma 4's per-type dicts).
        type_head_dim: layer types whose head size is another key of the config, mapped to
            `(key, default)` (Gemma 4's `global_head_dim`; transformers 5's `to_dict()`
            writes it as `per_layer_config`).
        rotary_dim_key: `rotary_dim` gives the rotated channels (MiniMax-M2: read as
            `partial_rotary_factor = rotary_dim / head_dim`, as its config class does).
        ntk_alpha: a `dynamic` scaling with an `alpha` is a fixed base `θ·α^(d/(d-2))`
            (Hunyuan's NTK-alpha; its `factor` is then unused).
        rope_interleave: how it reads the config's `rope_interleave`: `"reads"` (true, the
            default: interleaved, false: half; DeepSeek-V3), `"ignores"` (always
            interleaved, a false one is refused; DeepSeek-V3.2), or None (not a key of it).
        latent_attention: multi-head latent attention: only `qk_rope_head_dim` (default 64)
            channels of each head rotate, and the attention layers refuse it (DeepSeek).

    Layer attributes:
        layer_types: the layer types its config class makes when a config gives none.
        no_rope: how its NoPE layers are chosen: `"no_rope_layers"` (a 0/1 list per layer,
            1 = RoPE; SmolLM3, Llama 4), `"global"` (EXAONE 4: its full-attention layers,
            when the config has a sliding window), or None.
        empty_no_rope_layers: an empty `no_rope_layers` takes the default, as a null one
            does (Llama4TextConfig replaces both; SmolLM3Config only a null).
        positionless: layer types whose layers take no positions (linear attention, conv).

    Attention attributes:
        bias: `{config key: its config-class default}` (any true: biases), or a constant
            where the module hard-codes them. `use_bias=True` gives all four projections a
            bias; where transformers has none (Qwen2's, GLM's o_proj, ...) it loads as zeros.
        window: its sliding window, or None where its attention has none.
        gated: its attention gates the output (`sigmoid` of a per-head projection; Qwen3-Next).
        dropout: `(config key, its default)` of its attention dropout; None where the
            attention applies none.
        checks: settings of its attention these layers do not compute, each refused by one
            function (Gemma 2's soft-capping, Granite's `attention_multiplier`, ...).
        norm: its query / key norm, or None.
        refused_norm: a q/k norm these layers do not compute: `(config key that turns it
            on, or None: always, why)`.
        attention_chunk_size: its config class's default `attention_chunk_size`, for its
            `chunked_attention` layers (Llama 4).
        query_temperature: its NoPE layers scale their queries by `attention_temperature`
            (Llama 4).
    """

    layout: str = "half"
    theta: float | Mapping[str, float] = 10000.0
    partial: float = 1.0
    reads_partial: bool = True
    legacy: Mapping[str, tuple[str | None, str]] = dataclasses.field(default_factory=dict)
    scaling_types: tuple[str, ...] | None = None
    fixed: bool = False
    head_dim: int | None = None
    original_length: int | None = None
    longrope_aliases: bool = False
    mrope: tuple[int, ...] | None = None
    mrope_interleaved: bool = False
    defaults: Mapping | None = None
    type_head_dim: Mapping[str, tuple[str, int]] | None = None
    rotary_dim_key: bool = False
    ntk_alpha: bool = False
    rope_interleave: str | None = None
    latent_attention: bool = False

    layer_types: LayerTypes | None = None
    no_rope: str | None = None
    empty_no_rope_layers: bool = False
    positionless: tuple[str, ...] = ()

    bias: Mapping[str, bool] | bool
    window: Window | None = None
    gated: bool = False
    dropout: tuple[str, float] | None = ("attention_dropout", 0.0)
    checks: tuple[AttentionCheck, ...] = ()
    norm: Norm | None = None
    refused_norm: tuple[str | None, str] | None = None
    attention_chunk_size: int | None = None
    query_temperature: bool = False
