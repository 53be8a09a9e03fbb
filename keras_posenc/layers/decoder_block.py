"""`DecoderBlock`: one pre-norm Llama-style decoder block, with keras_hub's KV-cache call."""

from __future__ import annotations

import keras

from keras_posenc.layers.host_integers import RefusesHostIntegersPastInt32
from keras_posenc.layers.rope_options import ROPE_DEFAULTS
from keras_posenc.layers.rotary_group_query_attention import RotaryGroupQueryAttention

# The attention's RoPE options this block takes.
ROPE_NAMES = ("rope_max_wavelength", "rope_layout", "rope_dim", "rope_scaling")

MLP_KINDS = ("swiglu", "gelu")


@keras.saving.register_keras_serializable(package="keras_posenc")
class DecoderBlock(RefusesHostIntegersPastInt32, keras.layers.Layer):
    """RMSNorm -> grouped-query RoPE attention -> residual -> RMSNorm -> MLP -> residual.

    The block of Llama, Mistral and Qwen (`mlp="swiglu"`: `down(silu(gate(x)) * up(x))`),
    or with a plain GELU MLP (`down(gelu(up(x)))`, erf form). The attention is a
    `RotaryGroupQueryAttention` with `positions_from_mask=True`, no biases, and a causal
    mask: with a cache, a token's position is the count of real (unpadded) slots before
    it, so the rows of a left-padded batch decode as they would alone. A decode-step model
    made of `keras.layers.Embedding`, these blocks, one `keras.layers.RMSNormalization`
    and a `keras.layers.Dense` head (see `keras_posenc.decoder_models`) is what
    `keras_posenc.export.save_decoder` exports.

    Example:

    >>> block = DecoderBlock(head_dim=16, num_query_heads=4, num_key_value_heads=2,
    ...                      intermediate_dim=128)
    >>> x = np.random.normal(size=(2, 10, 64)).astype("float32")
    >>> tuple(block(x).shape)
    (2, 10, 64)
    >>> cache = np.zeros((2, 2, 32, 2, 16), "float32")  # (batch, 2, max_length, kv heads, head_dim)
    >>> y, cache = block(x, cache=cache, cache_update_index=0)
    >>> y, cache = block(x[:, :1], cache=cache, cache_update_index=10)
    >>> tuple(y.shape), tuple(cache.shape)
    ((2, 1, 64), (2, 2, 32, 2, 16))

    Args:
        head_dim: size of each attention head.
        num_query_heads: number of query heads.
        num_key_value_heads: number of key/value heads; divides `num_query_heads`.
        intermediate_dim: width of the MLP's hidden layer.
        mlp: `"swiglu"` or `"gelu"`.
        rope_max_wavelength, rope_layout, rope_dim, rope_scaling: the attention's RoPE
            (see `RotaryGroupQueryAttention`).
        layer_norm_epsilon: the two RMSNormalizations' epsilon.
        query_key_norm, query_key_norm_epsilon: the attention's query/key norms (Qwen3,
            Gemma 3, ...; see `RotaryGroupQueryAttention`). `save_decoder` exports the
            per-head ones, `"rms_per_head"` and `"gemma_rms_per_head"`.
        kernel_initializer: initializer of every kernel.
        **kwargs: base `keras.layers.Layer` arguments (`name`, `dtype`, ...).

    Call arguments:
        inputs: `(batch, sequence, width)`.
        padding_mask: optional `(batch, sequence)`, without a cache: 0 for padding tokens.
        cache: optional `(batch, 2, max_length, num_key_value_heads, head_dim)`.
        cache_update_index: the cache slot of the first token of `inputs`.
        cache_mask: optional `(batch, max_length)`, 0 for padding slots.
        training: as for any layer.

    Output shape: `(batch, sequence, width)`; with a cache, `(output, updated_cache)`.
    """

    def __init__(
        self,
        head_dim: int,
        num_query_heads: int,
        num_key_value_heads: int,
        intermediate_dim: int,
        mlp: str = "swiglu",
        rope_max_wavelength: float = ROPE_DEFAULTS["rope_max_wavelength"],
        rope_layout: str = ROPE_DEFAULTS["rope_layout"],
        rope_dim: int | None = ROPE_DEFAULTS["rope_dim"],
        rope_scaling: dict | None = ROPE_DEFAULTS["rope_scaling"],
        layer_norm_epsilon: float = 1e-6,
        query_key_norm: str | None = None,
        query_key_norm_epsilon: float = 1e-6,
        kernel_initializer="glorot_uniform",
        **kwargs,
    ):
        super().__init__(**kwargs)
        if mlp not in MLP_KINDS:
            raise ValueError(f"mlp must be one of {MLP_KINDS}, got {mlp!r}.")
        if int(intermediate_dim) < 1:
            raise ValueError(f"intermediate_dim must be positive, got {intermediate_dim!r}.")
        self.head_dim = int(head_dim)
        self.num_query_heads = int(num_query_heads)
        self.num_key_value_heads = int(num_key_value_heads)
        self.intermediate_dim = int(intermediate_dim)
        self.mlp = mlp
        self.layer_norm_epsilon = float(layer_norm_epsilon)
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.supports_masking = True
        policy = self.dtype_policy
        self.attention_norm = keras.layers.RMSNormalization(
            epsilon=self.layer_norm_epsilon, dtype=policy, name="attention_norm"
        )
        self.attention = RotaryGroupQueryAttention(
            self.head_dim,
            self.num_query_heads,
            self.num_key_value_heads,
            rope_max_wavelength=rope_max_wavelength,
            rope_layout=rope_layout,
            rope_dim=rope_dim,
            rope_scaling=rope_scaling,
            positions_from_mask=True,
            query_key_norm=query_key_norm,
            query_key_norm_epsilon=query_key_norm_epsilon,
            use_bias=False,
            kernel_initializer=self._initializer(),
            dtype=policy,
            name="attention",
        )
        self.mlp_norm = keras.layers.RMSNormalization(
            epsilon=self.layer_norm_epsilon, dtype=policy, name="mlp_norm"
        )
        self.gate = None
        if mlp == "swiglu":
            self.gate = self._dense(self.intermediate_dim, "gate")
        self.up = self._dense(self.intermediate_dim, "up")
        self.down = None  # its width is the input's: made in `build`

    def _initializer(self):
        # A copy per kernel, from the config alone: `keras.initializers.serialize` would
        # import TensorFlow on every backend where it is installed (Keras checks its types).
        initializer = self.kernel_initializer
        return type(initializer).from_config(initializer.get_config())

    def _dense(self, units: int, name: str) -> keras.layers.Dense:
        return keras.layers.Dense(
            units,
            use_bias=False,
            kernel_initializer=self._initializer(),
            dtype=self.dtype_policy,
            name=name,
        )

    def build(self, input_shape) -> None:
        if len(input_shape) != 3 or input_shape[-1] is None:
            raise ValueError(
                "DecoderBlock takes inputs of shape (batch, sequence, width) with a known "
                f"width, got shape {tuple(input_shape)}."
            )
        width = input_shape[-1]
        self.attention_norm.build(input_shape)
        self.attention.build(input_shape, input_shape)
        self.mlp_norm.build(input_shape)
        hidden_shape = (*input_shape[:-1], self.intermediate_dim)
        if self.gate is not None:
            self.gate.build(input_shape)
        self.up.build(input_shape)
        self.down = self._dense(width, "down")
        self.down.build(hidden_shape)
        super().build(input_shape)

    def call(
        self,
        inputs,
        padding_mask=None,
        cache=None,
        cache_update_index=None,
        cache_mask=None,
        training=None,
    ):
        h = self.attention_norm(inputs)
        if cache is None:
            attended = self.attention(
                h,
                h,
                query_mask=padding_mask,
                value_mask=padding_mask,
                use_causal_mask=True,
                training=training,
            )
        else:
            attended, cache = self.attention(
                h,
                h,
                use_causal_mask=True,
                cache=cache,
                cache_update_index=cache_update_index,
                cache_mask=cache_mask,
                training=training,
            )
        x = inputs + attended
        h = self.mlp_norm(x)
        if self.gate is not None:
            hidden = keras.ops.silu(self.gate(h)) * self.up(h)
        else:
            hidden = keras.ops.gelu(self.up(h), approximate=False)
        x = x + self.down(hidden)
        return x if cache is None else (x, cache)

    def compute_output_spec(self, inputs, padding_mask=None, cache=None, **kwargs):
        output = keras.KerasTensor(inputs.shape, dtype=self.compute_dtype)
        if cache is None:
            return output
        return output, keras.KerasTensor(cache.shape, dtype=cache.dtype)

    def get_config(self) -> dict:
        # The attention's own config: it also knows a NoPE layer (rope_dim=0).
        rope = self.attention.get_config()
        return {
            **super().get_config(),
            "head_dim": self.head_dim,
            "num_query_heads": self.num_query_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "intermediate_dim": self.intermediate_dim,
            "mlp": self.mlp,
            **{name: rope[name] for name in ROPE_NAMES},
            "layer_norm_epsilon": self.layer_norm_epsilon,
            "query_key_norm": rope["query_key_norm"],
            "query_key_norm_epsilon": rope["query_key_norm_epsilon"],
            "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
        }
