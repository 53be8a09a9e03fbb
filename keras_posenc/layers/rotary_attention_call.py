"""The call the rotary attention layers share: project, rotate, update the cache, attend.

`RotaryMultiHeadAttention` and `RotaryGroupQueryAttention` differ only in how many key/value
heads they project; everything after the projections lives here, once. Positions travel
with the call (never on the instance), so one layer can serve several threads at a time.

With a `cache` of shape `(batch, 2, max_length, num_key_value_heads, head_dim)` the new keys
are rotated at their own positions and written, rotated, at `cache_update_index`; the
queries attend over the whole cache through a mask that hides the slots not filled yet, so
every shape is static and one compiled step serves every position.
"""

from __future__ import annotations

import keras
import numpy as np
from keras import ops

from keras_posenc.backend import keras_private as private
from keras_posenc.layers.attend import attend, mask_without_cache, tempered, tricks
from keras_posenc.layers.host_integers import RefusesHostIntegersPastInt32
from keras_posenc.layers.kv_cache import (
    checked_cache_call,
    checked_cache_step,
    checked_call_without_cache,
    columns,
    visible_slots,
    written,
)
from keras_posenc.layers.query_key_norm import QueryKeyNorm, checked_query_key_norm, is_after_rope
from keras_posenc.layers.rope_options import (  # noqa: F401  ROPE_DEFAULTS, renamed_rope_options: re-exported
    OLD_ROPE_NAMES,
    ROPE_DEFAULTS,
    ROPE_OPTIONS,
    is_nope,
    renamed_rope_options,
)
from keras_posenc.layers.rotary import RotaryEmbedding


class RotaryAttention(RefusesHostIntegersPastInt32):
    """Mixin for a Keras attention layer whose projected queries and keys are rotated.

    Listed before the Keras base class, it replaces the base's `call` and adds the rotary
    part to its `build` and `get_config`; the base keeps its weights, masks
    (`attention_mask`) and softmax, reached through `keras_posenc.backend.keras_private`. The call
    is `keras.ops` on every backend, a backend's differences behind `lazy.tricks()`.
    A subclass defines `_head_counts() -> (num_query_heads, num_key_value_heads, key_dim,
    value_dim)`, `_scale()`, `_window()` (the sliding window or None) and `_uses_gate()`.
    """

    # The head arguments' names in `configs.arguments.attention_arguments`.
    _CONFIG_FORM = "gqa"

    @classmethod
    def from_transformers_config(
        cls, config, layer_type: str | None = None, *, layer_index: int | None = None, **overrides
    ):
        """The attention layer a transformers model config describes: heads, head size, RoPE.

        Args:
            config: a transformers config or its dict (see `keras_posenc.configs.arguments`).
            layer_type: the layer type to read for configs with RoPE per layer type.
            layer_index: the decoder layer to read; a family with NoPE layers (SmolLM3,
                Llama 4, EXAONE 4) needs it unless `layer_type` alone says which kind it is.
            **overrides: further layer arguments, or ones replacing what the config gives.
        """
        from keras_posenc.configs.arguments import attention_arguments

        arguments = attention_arguments(
            config, layer_type, form=cls._CONFIG_FORM, layer_index=layer_index
        )
        return cls(**{**arguments, **overrides})

    # Llama 4's options (`RotaryGroupQueryAttention` takes them): see `attend`. The
    # sublayers (`query_temperature`, `query_norm`, `key_norm`) are set on each layer in
    # `_init_*`, never given a class-level default: on torch a Keras layer is a
    # `torch.nn.Module`, which keeps sublayers apart from the instance's attributes, and a
    # class attribute of the same name would hide them (reading None).
    attention_chunk_size = None
    # The query / key norms (`keras_posenc.layers.query_key_norm`); their layers are made in build.
    query_key_norm = None
    query_key_norm_epsilon = 1e-6

    def _init_query_key_norm(self, kind: str | None, epsilon: float) -> None:
        self.query_key_norm, self.query_key_norm_epsilon = checked_query_key_norm(kind, epsilon)
        self.query_norm = self.key_norm = None

    def _init_rotary(self, options: dict, positions_from_mask: bool) -> None:
        self.query_temperature = None  # an AttentionTemperature, or None
        self.rotary_embedding = None  # rope_dim=0: a NoPE layer
        if not is_nope(options):
            self.rotary_embedding = RotaryEmbedding(
                **{ROPE_OPTIONS[name]: value for name, value in options.items()},
                sequence_axis=1,
                feature_axis=-1,
                dtype=self.dtype_policy,
                name="rotary_embedding",
            )
        if not isinstance(positions_from_mask, (bool, np.bool_)):
            raise TypeError(
                f"positions_from_mask must be True or False, got {positions_from_mask!r}."
            )
        self.positions_from_mask = bool(positions_from_mask)

    def build(self, query_shape, value_shape, key_shape=None) -> None:
        if len(query_shape) != 3:
            raise ValueError(
                f"{type(self).__name__} takes queries of shape (batch, sequence, features), "
                f"got shape {tuple(query_shape)}."
            )
        super().build(query_shape, value_shape, key_shape)
        # Queries and keys share the head size, whatever their number of heads.
        heads, kv_heads, head_dim, _ = self._head_counts()
        if self.rotary_embedding is not None:
            self.rotary_embedding.build((None, None, None, head_dim))
        if self.query_key_norm is not None:
            for role, count in (("query", heads), ("key", kv_heads)):
                norm = QueryKeyNorm(
                    self.query_key_norm,
                    self.query_key_norm_epsilon,
                    dtype=self.dtype_policy,
                    name=f"{role}_norm",
                )
                norm.build((None, None, count, head_dim))
                setattr(self, f"{role}_norm", norm)

    def get_config(self) -> dict:
        rope = self.rotary_embedding
        options = {**ROPE_DEFAULTS, "rope_dim": 0}
        if rope is not None:
            options = {name: getattr(rope, option) for name, option in ROPE_OPTIONS.items()}
        return {
            **super().get_config(),
            **options,
            "positions_from_mask": self.positions_from_mask,
            "query_key_norm": self.query_key_norm,
            "query_key_norm_epsilon": self.query_key_norm_epsilon,
        }

    @classmethod
    def from_config(cls, config: dict):
        config = dict(config)
        for old, new in OLD_ROPE_NAMES.items():
            if old in config:
                config.setdefault(new, config.pop(old))
        return super().from_config(config)

    def call(
        self,
        query,
        value,
        key=None,
        query_mask=None,
        value_mask=None,
        key_mask=None,
        attention_mask=None,
        return_attention_scores=False,
        training=None,
        use_causal_mask=False,
        query_positions=None,
        key_positions=None,
        query_start_index=0,
        key_start_index=0,
        cache=None,
        cache_update_index=None,
        cache_mask=None,
    ):
        key_given = key is not None
        key = value if key is None else key
        if query_mask is None:
            query_mask = private.get_keras_mask(query)
        # The masks are applied here; the projections must not see (and warn about) them.
        for tensor in (query, value, key):
            private.set_keras_mask(tensor, None)
        gate, *heads = self._project(query, key, value)
        masks = {"query_mask": query_mask, "value_mask": value_mask, "key_mask": key_mask}
        query_at, key_at = (query_positions, query_start_index), (key_positions, key_start_index)
        if cache is None:
            checked_call_without_cache(cache_update_index, cache_mask)
            query_at, key_at = self._positions_without_cache(masks, key_given, query_at, key_at)
            heads[:2] = self._rotate_queries_and_keys(*heads[:2], key is query, query_at, key_at)
            heads[0] = tempered(heads[0], self.query_temperature, query_start_index)
            attention_mask, causal_only = mask_without_cache(
                self,
                (self._window(), self.attention_chunk_size),
                query,
                value,
                masks,
                attention_mask,
                use_causal_mask,
                (query_start_index, key_start_index),
            )
            new_cache = None
        else:
            checked_cache_call(return_attention_scores, value_mask, key_mask, query_at, key_at)
            *heads, attention_mask, new_cache = self._use_cache(
                key is query,
                (cache, cache_update_index, cache_mask),
                heads,
                (query_positions, key_positions),
                query_mask,
                attention_mask,
                use_causal_mask,
            )
            causal_only = False
        output, scores = attend(
            self,
            self._group_and_scale(),
            *heads,
            attention_mask,
            causal_only,
            training,
            return_attention_scores,
        )
        output = private.attention_part(self, "output_dense")(
            output if gate is None else ops.multiply(output, gate)
        )
        if query_mask is not None:
            private.set_keras_mask(output, query_mask)
        if new_cache is not None:
            return output, new_cache
        if return_attention_scores:
            return output, scores
        return output

    def _group_and_scale(self) -> tuple[int, float]:
        """The query heads per key/value head, and the scores' scale (for `attend`)."""
        query_heads, kv_heads, _, _ = self._head_counts()
        return query_heads // kv_heads, self._scale()

    def _project(self, query, key, value):
        """`(gate or None, query heads, key heads, value heads)`: the base layer's projections."""
        gate = private.attention_part(self, "gate_dense")(query) if self._uses_gate() else None
        return (
            gate,
            private.attention_part(self, "query_dense")(query),
            private.attention_part(self, "key_dense")(key),
            private.attention_part(self, "value_dense")(value),
        )

    def _positions_without_cache(self, masks: dict, key_given: bool, query_at, key_at):
        """`(positions, start_index)` of the queries and of the keys, without a cache.

        With `positions_from_mask`, positions not given come from the queries' mask and
        the keys' own (`key_mask`, else `value_mask`); from a mask they start at 0.
        """
        (query_positions, query_start), (key_positions, key_start) = query_at, key_at
        if self.positions_from_mask:
            # (The keys share the queries' positions when they share their mask and their
            # start, the queries' start being 0 once taken from the mask.)
            query_mask = masks["query_mask"]
            own_key_mask = masks["key_mask"] if key_given else masks["value_mask"]
            if query_positions is None and query_mask is not None:
                query_positions = self._on_every_axis(
                    tricks().positions_of_padding(query_mask, query_start)
                )
                query_start = 0
            if key_positions is None and own_key_mask is not None:
                if own_key_mask is query_mask and key_start is query_start:
                    key_positions = query_positions
                else:
                    key_positions = self._on_every_axis(
                        tricks().positions_of_padding(own_key_mask, key_start)
                    )
                key_start = 0
        return (query_positions, query_start), (key_positions, key_start)

    def _on_every_axis(self, positions):
        """`(batch, sequence)` positions of padded text, the same on every axis of a
        multi-axis RoPE (`(batch, sequence, axes)`, as `RotaryEmbedding` takes them)."""
        axes = 1 if self.rotary_embedding is None else self.rotary_embedding.position_axes
        return positions if axes == 1 else ops.stack([positions] * axes, -1)

    def _rotate_queries_and_keys(self, query_heads, key_heads, same_tokens, query_at, key_at):
        """Queries and keys normalized (`query_key_norm`: before RoPE, or after it for the
        `*_after_rope` kinds) and rotated at `(positions, start_index)` `query_at` / `key_at`."""
        after = is_after_rope(self.query_key_norm)
        if self.query_norm is not None and not after:
            query_heads, key_heads = self.query_norm(query_heads), self.key_norm(key_heads)
        query_heads, key_heads = self._rotated(
            query_heads, key_heads, same_tokens, query_at, key_at
        )
        if self.query_norm is not None and after:
            query_heads, key_heads = self.query_norm(query_heads), self.key_norm(key_heads)
        return query_heads, key_heads

    def _rotated(self, query_heads, key_heads, same_tokens, query_at, key_at):
        """Queries and keys rotated at `(positions, start_index)` `query_at` / `key_at`.

        Self-attention rotates both at the same positions: one row lookup serves both, so
        an exported graph holds one (and onnxruntime runs one) per layer, not two.
        """
        (query_positions, query_start), (key_positions, key_start) = query_at, key_at
        if self.rotary_embedding is None:
            return query_heads, key_heads  # NoPE: positions play no part
        same_start = query_start is key_start or (
            isinstance(query_start, (int, np.integer))
            and isinstance(key_start, (int, np.integer))
            and query_start == key_start
        )
        if same_tokens and query_positions is key_positions and same_start:
            return self.rotary_embedding.rotate_together(
                (query_heads, key_heads), positions=query_positions, start_index=query_start
            )
        return (
            self.rotary_embedding(query_heads, positions=query_positions, start_index=query_start),
            self.rotary_embedding(key_heads, positions=key_positions, start_index=key_start),
        )

    def _use_cache(
        self, same_tokens, cache_at, heads, positions, query_mask, attention_mask, use_causal_mask
    ):
        """Rotate the new queries and keys, write keys and values, and mask the unfilled slots.

        `cache_at` is `(cache, cache_update_index, cache_mask)`, `heads` the new queries,
        keys and values, `positions` the queries' and the keys' (None: from the index).
        """
        query_heads, key_heads, value_heads = heads
        query_positions, key_positions = positions
        cache, cache_mask, attention_mask, sizes, valid = checked_cache_step(
            cache_at, self._head_counts()[1:], query_heads, key_heads, attention_mask
        )
        index, steps, new, max_length = sizes
        if self.positions_from_mask and cache_mask is not None:
            # A slot's position: the real tokens before it (the query of a decode step too).
            slots = self._on_every_axis(tricks().positions_of_padding(cache_mask))
            if query_positions is None:
                query_positions = columns(slots, index, steps)
            if key_positions is None:
                key_positions = query_positions if same_tokens else columns(slots, index, new)
        elif key_positions is None and query_positions is not None:
            # The new keys are the new tokens: by default they sit where the queries do.
            key_positions = query_positions
        # Explicit positions take start 0 (the checks refuse both at once).
        query_heads, key_heads = self._rotate_queries_and_keys(
            query_heads,
            key_heads,
            same_tokens,
            (query_positions, index if query_positions is None else 0),
            (key_positions, index if key_positions is None else 0),
        )
        query_heads = tempered(query_heads, self.query_temperature, index)
        if valid is not None:
            # In every graph, not only where assertions are dropped (`tf_backend.nan_unless`):
            # the select covers the new tokens only, and an exported graph stays safe
            # whichever way it was traced (under `jax.jit`, the traced checks' answer).
            query_heads, key_heads, value_heads = (
                ops.where(valid, x, float("nan")) for x in (query_heads, key_heads, value_heads)
            )

        update = ops.cast(ops.stack([key_heads, value_heads], axis=1), cache.dtype)
        new_cache = written(cache, update, index, new, max_length)
        keys, values = new_cache[:, 0], new_cache[:, 1]

        visible = visible_slots(
            sizes,
            use_causal_mask,
            (self._window(), self.attention_chunk_size),
            (cache_mask, query_mask, attention_mask),
        )
        return query_heads, keys, values, visible, new_cache

    def compute_output_spec(
        self,
        query,
        value,
        key=None,
        query_mask=None,
        value_mask=None,
        key_mask=None,
        attention_mask=None,
        return_attention_scores=False,
        training=None,
        use_causal_mask=False,
        query_positions=None,
        key_positions=None,
        query_start_index=0,
        key_start_index=0,
        cache=None,
        cache_update_index=None,
        cache_mask=None,
    ):
        # Positions change values, not shapes; a cache comes back with its own shape.
        spec = super().compute_output_spec(
            query,
            value,
            key=key,
            return_attention_scores=return_attention_scores and cache is None,
        )
        if cache is None:
            return spec
        return spec, keras.KerasTensor(cache.shape, dtype=cache.dtype)
