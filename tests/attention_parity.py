"""Running transformers' attention modules beside the package's attention layers.

A tiny random transformers model (`transformers_side`) runs once with a forward hook on each
decoder layer's attention, which keeps its input and output; `copy_weights` gives a
`RotaryGroupQueryAttention` that module's weights; `cached_outputs` runs the layer as a
decode does (a prefill, then one token at a time). A causal attention's row j is the same
whichever way it is computed, so both must equal transformers' output.
"""

from __future__ import annotations

import numpy as np

from keras_posenc.backend import tensorflow as tf_backend

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
_NORMS = {
    "query": ("q_norm", "q_layernorm", "query_layernorm"),
    "key": ("k_norm", "k_layernorm", "key_layernorm"),
}


def transformers_side(raw: dict, length: int):
    """`{layer index: (attention module, input, output)}` of a tiny model of config `raw`.

    Every attention weight is redrawn: norms' scales away from 1 (or 0) and biases nonzero,
    so a missing scale or bias shows. Layers without attention (LFM2's convolutions) are
    left out.
    """
    import torch
    import transformers

    config = transformers.AutoConfig.for_model(**raw)
    torch.manual_seed(0)
    model = transformers.AutoModel.from_config(config, attn_implementation="eager").eval()
    generator = torch.Generator().manual_seed(1)
    seen, hooks = {}, []
    for index, layer in enumerate(model.layers):
        attention = getattr(layer, "self_attn", None)
        if attention is None:
            continue
        with torch.no_grad():
            for name, weight in attention.named_parameters():
                if "norm" in name:
                    weight.copy_(torch.rand(weight.shape, generator=generator) + 0.5)
                else:
                    weight.copy_(torch.randn(weight.shape, generator=generator) * 0.3)

        def hook(module, args, kwargs, output, index=index):
            hidden = kwargs.get("hidden_states", args[0] if args else None)
            seen[index] = (module, hidden.detach().numpy(), output[0].detach().numpy())
            module._parity_kwargs = kwargs  # the tables and mask, for `exact_attention`

        hooks.append(attention.register_forward_hook(hook, with_kwargs=True))
    ids = torch.tensor(np.random.default_rng(0).integers(1, 64, (2, length)))
    with torch.no_grad():
        model(input_ids=ids)
    for hook in hooks:
        hook.remove()
    return seen


def copy_weights(layer, module, x: np.ndarray) -> None:
    """Gives `layer` (built here on `x`) the weights of transformers' attention `module`.

    Qwen3-Next's q_proj holds per head the queries then the gate; a projection without a
    bias in transformers gets a zero one here (Keras's `use_bias` is all four or none).
    """
    layer(x[:, :1], x[:, :1])
    heads, kv_heads, head_dim = layer.num_query_heads, layer.num_key_value_heads, layer.head_dim
    width = x.shape[-1]

    def weights(name, count, rows):
        linear = getattr(module, name)
        kernel = linear.weight.detach().numpy().reshape(count, rows, width)
        bias = linear.bias
        bias = np.zeros((count, rows)) if bias is None else bias.detach().numpy()
        return kernel, bias.reshape(count, rows)

    gated = layer._uses_gate()
    query, query_bias = weights("q_proj", heads, head_dim * (2 if gated else 1))
    parts = {
        "query_dense": (query[:, :head_dim], query_bias[:, :head_dim]),
        "key_dense": weights("k_proj", kv_heads, head_dim),
        "value_dense": weights("v_proj", kv_heads, head_dim),
    }
    if gated:
        parts["gate_dense"] = (query[:, head_dim:], query_bias[:, head_dim:])
    for part, (kernel, bias) in parts.items():
        dense = tf_backend.attention_part(layer, part)
        dense.kernel.assign(kernel.transpose(2, 0, 1))
        if dense.bias is not None:
            dense.bias.assign(bias)
        else:
            assert not bias.any(), part
    projection = getattr(module, "o_proj", None) or module.out_proj
    output = tf_backend.attention_part(layer, "output_dense")
    output.kernel.assign(projection.weight.detach().numpy().T.reshape(heads, head_dim, width))
    if output.bias is not None:
        bias = projection.bias
        output.bias.assign(np.zeros(width) if bias is None else bias.detach().numpy())
    for role, names in _NORMS.items():
        norm = getattr(layer, f"{role}_norm", None)
        if norm is not None and norm.scale is not None:
            source = next(getattr(module, n) for n in names if hasattr(module, n))
            weight = source.weight.detach().numpy()
            norm.scale.assign(weight.reshape(tuple(norm.scale.shape)))


def cached_outputs(layer, x: np.ndarray, prefill: int) -> np.ndarray:
    """`layer`'s outputs on `x` from a cache: `prefill` tokens in one call, then one by one."""
    length = x.shape[1]
    kv_heads, head_dim = layer.num_key_value_heads, layer.head_dim
    cache = np.zeros((x.shape[0], 2, length, kv_heads, head_dim), np.float32)
    outputs = []
    for start, stop in ((0, prefill), *((i, i + 1) for i in range(prefill, length))):
        step = x[:, start:stop]
        output, cache = layer(
            step, step, use_causal_mask=True, cache=cache, cache_update_index=start
        )
        outputs.append(np.asarray(output))
    return np.concatenate(outputs, axis=1)


def exact_attention(module, x: np.ndarray, arguments=None, query_factor=None):
    """`(output, bound)`: transformers' `module` run in float64 on `x`, and the most a float32
    evaluation of the same attention can be from it (`attention_error.attention_error`).

    The module's float64 twin gives the exact output, the probabilities and each q/k norm's
    input and output (their gains); the call's other arguments (RoPE tables, mask) are
    `arguments`, by default those `transformers_side` saw. `query_factor`: the queries'
    factors per position (Llama 4's attention temperature), if any.
    """
    import copy

    import torch
    from attention_error import attention_error
    from float32_error import TABLE_ERROR, U, torch_table_error

    twin = copy.deepcopy(module).double()
    kwargs = {}
    arguments = module._parity_kwargs if arguments is None else arguments
    for name, value in arguments.items():
        if name in ("cache", "past_key_values", "past_key_value", "hidden_states"):
            continue
        if isinstance(value, tuple):
            value = tuple(t.double() if torch.is_tensor(t) else t for t in value)
        elif torch.is_tensor(value) and value.is_floating_point():
            value = value.double()
        kwargs[name] = value
    tables = arguments.get("position_embeddings")
    if tables is not None:  # (cos, sin), or Llama 4's complex cos + i sin
        size = tables[0] ** 2 + tables[1] ** 2 if isinstance(tables, tuple) else tables.abs() ** 2
        # attention_error takes a rotation to keep a vector's length: no attention factor.
        assert float(size.max()) <= 1 + 8 * U, "a RoPE attention factor: not in the bound"
    records, hooks = [], []
    for name, child in twin.named_children():
        if "norm" in name:
            hooks.append(
                child.register_forward_hook(
                    lambda _, args, out: records.append((args[0].numpy(), out.numpy()))
                )
            )
    with torch.no_grad():
        output, weights = twin(hidden_states=torch.tensor(x, dtype=torch.float64), **kwargs)[:2]
    for hook in hooks:
        hook.remove()
    batch, length, _ = x.shape
    heads, head_dim = module.config.num_attention_heads, module.head_dim
    kv_heads = module.config.num_key_value_heads
    norms = {}
    for a, b in records:
        if a.ndim == 4 and a.shape[1] != length:  # (batch, heads, T, head_dim)
            a, b = a.transpose(0, 2, 1, 3), b.transpose(0, 2, 1, 3)
        a, b = (t.reshape(batch, length, -1, t.shape[-1]) for t in (a, b))
        role = "query" if a[0, 0].size == heads * head_dim else "key"
        assert role not in norms and a[0, 0].size in (heads * head_dim, kv_heads * head_dim)
        norms[role] = (a, b)
    kernels = {}
    projections = {"query": "q_proj", "key": "k_proj", "value": "v_proj", "output": "o_proj"}
    for role, name in projections.items():
        linear = getattr(module, name, None) or module.out_proj
        kernels[role] = linear.weight.detach().double().numpy().T
        if linear.bias is not None:
            kernels[role + "_bias"] = linear.bias.detach().double().numpy()
    bound = attention_error(
        x.astype(np.float64),
        kernels,
        heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        scale=module.scaling,
        weights=weights.numpy(),
        norms=norms,
        gate=kernels["query"].shape[1] == 2 * heads * head_dim,
        # The twin's tables are torch's float32 ones (`torch_table_error`), the package's
        # within TABLE_ERROR of the exact ones; 4 u more where the twin rotates in float32
        # still (Llama 4's complex product).
        table_error=TABLE_ERROR + torch_table_error(length) + 4 * U,
        query_factor=query_factor,
    )
    return output.numpy(), bound


def assert_same_attention(actual, module, x: np.ndarray, expected=None) -> None:
    """Assert a float32 attention output, and transformers' own (`expected`), lie within the
    float32 bound of `module`'s exact (float64) output on `x`."""
    from float32_error import _assert_at_most

    if getattr(module, "_parity_exact", None) is None:
        module._parity_exact = exact_attention(module, x)
    exact, bound = module._parity_exact
    for result in (actual, expected) if expected is not None else (actual,):
        _assert_at_most(np.abs(np.asarray(result, np.float64) - exact), bound, None)


def assert_other_attention(actual, module, x: np.ndarray) -> None:
    """Assert a float32 attention output is outside the float32 bound of `module`'s exact
    output somewhere: no float32 evaluation of `module`'s attention could give it."""
    if getattr(module, "_parity_exact", None) is None:
        module._parity_exact = exact_attention(module, x)
    exact, bound = module._parity_exact
    difference = np.abs(np.asarray(actual, np.float64) - exact)
    assert (difference > bound).any(), f"within the float32 bound: {difference.max():.3g}"


def norm_epsilon(module) -> float | None:
    """The epsilon of transformers' q/k norm in attention `module` (None: no norm)."""
    for name, child in module.named_children():
        if "norm" in name:
            return float(getattr(child, "variance_epsilon", getattr(child, "eps", None)))
    return None
