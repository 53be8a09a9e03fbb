"""The layouts of keras_hub's caches, empty, for `call_with_cache` (a `HubFamily.empty_cache`).

keras_hub builds its cache in `CausalLM._build_cache`; the reference generation
(`reference_generation.py`) builds the same for a batch and a number of slots, in the
CausalLM's compute dtype (float64 for a float64 reference).
"""

from __future__ import annotations


def _slot_shape(backbone, slots: int) -> tuple[int, int, int]:
    """`(slots, kv_heads, head_dim)` of one layer's keys (or values)."""
    heads = getattr(backbone, "num_query_heads", None) or backbone.num_attention_heads  # SmolLM3
    head_dim = getattr(backbone, "head_dim", None) or backbone.hidden_dim // heads
    # Gemma 4's global layers may be wider: keras_hub's `_build_cache` sizes by the widest.
    head_dim = max(head_dim, getattr(backbone, "global_head_dim", None) or 0)
    return slots, backbone.num_key_value_heads, head_dim


def stacked_cache(causal_lm, batch: int, slots: int):
    """Most families' cache: one tensor `(batch, num_layers, 2, slots, kv_heads, head_dim)`."""
    import keras

    backbone = causal_lm.backbone
    shape = _slot_shape(backbone, slots)
    return keras.ops.zeros((batch, backbone.num_layers, 2, *shape), causal_lm.compute_dtype)


def layer_pairs_cache(causal_lm, batch: int, slots: int):
    """Gemma 3's: a `(key, value)` pair of `(batch, slots, kv_heads, head_dim)` per layer."""
    import keras

    backbone = causal_lm.backbone
    shape, dtype = (batch, *_slot_shape(backbone, slots)), causal_lm.compute_dtype
    zeros = keras.ops.zeros
    return tuple((zeros(shape, dtype), zeros(shape, dtype)) for _ in range(backbone.num_layers))
