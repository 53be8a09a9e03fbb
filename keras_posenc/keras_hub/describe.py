"""A keras_hub CausalLM's backbone read into the export's `Decoder` (weights and settings).

The families share one layout (`backbone.token_embedding`, `transformer_layers[i]` with
`_self_attention_layernorm`, `_self_attention_layer` (`_query_dense`, `_key_dense`,
`_value_dense`, `_output_dense`, `rotary_embedding_layer`), `_feedforward_layernorm`,
gate / intermediate / output Dense, and `backbone.layer_norm`); `FAMILIES` says what
each one adds (biases, q/k norms, sliding windows). Anything else is refused with an
error naming the class or the setting.
"""

from __future__ import annotations

import math

import keras
import numpy as np

from keras_posenc.export.decoder.description import Attention, Block, Decoder, Mlp, Norm
from keras_posenc.export.errors import ExportError
from keras_posenc.keras_hub import rope as rope_tables

# Class name -> how its attention layers say their sliding window (None: no window).
FAMILIES = {
    "LlamaCausalLM": lambda attention: None,
    "Llama3CausalLM": lambda attention: None,
    "MistralCausalLM": lambda attention: attention._sliding_window,
    "QwenCausalLM": lambda attention: (
        attention.sliding_window_size if attention.use_sliding_window_attention else None
    ),
    "Qwen3CausalLM": lambda attention: attention.sliding_window_size or None,
}
# keras_hub's aliases of the classes above (the same class under another name).
ALIASES = {"Qwen2CausalLM": "QwenCausalLM"}


def is_keras_hub_causal_lm(model) -> bool:
    """Whether `model` is a keras_hub `CausalLM` (without importing keras_hub)."""
    return any(
        cls.__name__ == "CausalLM" and cls.__module__.startswith("keras_hub.")
        for cls in type(model).__mro__
    )


def _array(variable) -> np.ndarray:
    return np.asarray(keras.ops.convert_to_numpy(variable), np.float32)


def _family(causal_lm) -> str:
    name = type(causal_lm).__name__
    if not type(causal_lm).__module__.startswith("keras_hub.") or name not in FAMILIES:
        supported = ", ".join([*FAMILIES, *ALIASES])
        raise ExportError(
            f"save_decoder exports these keras_hub CausalLMs: {supported}; "
            f"{type(causal_lm).__module__}.{name} is not one of them."
        )
    return name


def _norm(layer, owner: str) -> Norm:
    kind = type(layer).__name__
    if kind not in (
        "LlamaLayerNorm",
        "MistralLayerNormalization",
        "QwenLayerNorm",
        "Qwen3LayerNorm",
    ):
        raise ExportError(f"{owner}: its norm {kind} is not an RMSNorm the export reads.")
    return Norm(_array(layer.scale), float(layer.epsilon))


def _dense(layer, owner: str) -> np.ndarray:
    if layer.bias is not None or layer.activation is not keras.activations.linear:
        raise ExportError(f"{owner}: its Dense {layer.name!r} has a bias or an activation.")
    return _array(layer.kernel)


def _einsum_bias(layer) -> np.ndarray | None:
    bias = getattr(layer, "bias", None)
    return None if bias is None else _array(bias).reshape(-1)


def _attention(layer, window, max_length: int, owner: str) -> tuple[Attention, object]:
    query = _array(layer._query_dense.kernel)  # (width, heads, head_dim)
    key = _array(layer._key_dense.kernel)
    width, heads, head_dim = query.shape
    kv_heads = key.shape[1]
    output_dense = layer._output_dense
    if getattr(output_dense, "bias", None) is not None:
        raise ExportError(f"{owner}: an attention output bias is not exported.")
    norms = {}
    for part in ("query", "key"):
        norm_layer = getattr(layer, f"_{part}_dense_layer_norm", None)
        norms[part] = None if norm_layer is None else _norm(norm_layer, owner)
    attention = Attention(
        num_heads=heads,
        kv_num_heads=kv_heads,
        head_dim=head_dim,
        scale=1.0 / math.sqrt(head_dim),  # keras_hub's `_inv_norm_factor`
        query=query.reshape(width, heads * head_dim),
        key=key.reshape(width, kv_heads * head_dim),
        value=_array(layer._value_dense.kernel).reshape(width, kv_heads * head_dim),
        output=_array(output_dense.kernel).reshape(heads * head_dim, width),
        query_bias=_einsum_bias(layer._query_dense),
        key_bias=_einsum_bias(layer._key_dense),
        value_bias=_einsum_bias(layer._value_dense),
        query_norm=norms["query"],
        key_norm=norms["key"],
        # A window as wide as the cache masks nothing.
        window=None if window is None or window >= max_length else int(window),
    )
    return attention, layer.rotary_embedding_layer


def _block(layer, family: str, max_length: int, owner: str) -> tuple[Block, object]:
    activation = getattr(layer, "activation", None)
    if activation is None or keras.activations.serialize(activation) != "silu":
        raise ExportError(f"{owner}: the feedforward activation must be silu (SwiGLU).")
    self_attention = layer._self_attention_layer
    attention, rotary = _attention(
        self_attention, FAMILIES[family](self_attention), max_length, owner
    )
    mlp = Mlp(
        kind="swiglu",
        gate=_dense(layer._feedforward_gate_dense, owner),
        up=_dense(layer._feedforward_intermediate_dense, owner),
        down=_dense(layer._feedforward_output_dense, owner),
    )
    block = Block(
        _norm(layer._self_attention_layernorm, owner),
        attention,
        _norm(layer._feedforward_layernorm, owner),
        mlp,
    )
    return block, rotary


def _rope(rotaries: list, head_dim: int, max_length: int, tables: str, owner: str):
    wavelength, scaling = rope_tables.rope_settings(rotaries[0], owner)
    for rotary in rotaries[1:]:
        if rope_tables.rope_settings(rotary, owner) != (wavelength, scaling):
            raise ExportError(f"{owner}: its layers have different RoPE settings.")
    exact = rope_tables.exact_tables(head_dim, wavelength, scaling, max_length)
    keras_hub = rope_tables.keras_hub_tables(rotaries[0], head_dim, max_length)
    rope_tables.check_agreement(exact, keras_hub, max_length, owner)
    return exact if tables == "exact" else keras_hub


def describe_causal_lm(causal_lm, max_length: int, *, tables: str = "exact") -> Decoder:
    """The `Decoder` of keras_hub `causal_lm` (one of `FAMILIES`).

    Args:
        causal_lm: a keras_hub CausalLM in float32.
        max_length: cache slots and RoPE table rows of the export (prompt included).
        tables: `"exact"` (the package's float64 tables rounded once, the default) or
            `"keras_hub"` (the float32 rows keras_hub's own layer computes: the same
            arithmetic as keras_hub, to measure what the exact tables change).

    Raises:
        ExportError: another class, a dtype other than float32, or a setting the export
            cannot write exactly (named).
    """
    if tables not in ("exact", "keras_hub"):
        raise ValueError(f"tables must be 'exact' or 'keras_hub', got {tables!r}.")
    family = _family(causal_lm)
    backbone = causal_lm.backbone
    owner = f"{type(causal_lm).__name__} {backbone.name!r}"
    policy = backbone.dtype_policy
    if (policy.compute_dtype, policy.variable_dtype) != ("float32", "float32"):
        raise ExportError(
            f"{owner} computes in {policy.compute_dtype} (variables {policy.variable_dtype}); "
            "the export is float32 and verified against keras_hub in float32: load it with "
            'dtype="float32" (e.g. `from_preset(..., dtype="float32")`).'
        )
    max_length = int(max_length)
    read = [
        _block(layer, family, max_length, f"{owner} layer {i}")
        for i, layer in enumerate(backbone.transformer_layers)
    ]
    blocks = tuple(block for block, _ in read)
    first = blocks[0].attention
    for block in blocks[1:]:
        a = block.attention
        if (a.num_heads, a.kv_num_heads, a.head_dim) != (
            first.num_heads,
            first.kv_num_heads,
            first.head_dim,
        ):
            raise ExportError(f"{owner}: its layers differ in head counts.")
    embedding = backbone.token_embedding
    table = _array(embedding.embeddings)
    if getattr(embedding, "logit_soft_cap", None):
        raise ExportError(f"{owner}: a final logit soft cap is not exported.")
    head = table.T if embedding.tie_weights else _array(embedding.reverse_embeddings)
    return Decoder(
        embedding=table,
        blocks=blocks,
        final_norm=_norm(backbone.layer_norm, owner),
        head=np.ascontiguousarray(head),
        head_bias=None,
        rope=_rope([r for _, r in read], first.head_dim, max_length, tables, owner),
        max_length=max_length,
    )
