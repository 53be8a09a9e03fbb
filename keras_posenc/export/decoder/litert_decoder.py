"""A `Decoder` as a LiteRT file with `prefill` and `decode` signatures, as litert-torch has them.

Both signatures take `tokens` int32 `(batch, sequence)` (`decode`: sequence 1),
`input_pos` int32 `(sequence,)` (the cache slots the new tokens are written to, as
consecutive slots from `input_pos[0]`), `mask` float32 `(batch, 1, sequence, max_length)`
(0 where a query attends to a slot, negative (`-inf`) where it does not: causal and
padding, as litert-torch's additive mask) and per layer `kv_cache_k_{i}` /
`kv_cache_v_{i}` float32 `(batch, num_key_value_heads, max_length, head_dim)`; they
return `logits` `(batch, sequence, vocabulary)` and the updated `kv_cache_k_{i}` /
`kv_cache_v_{i}` (litert-torch's names; the cache is fixed-size and written with one
`DYNAMIC_UPDATE_SLICE` per tensor, so a runtime can keep one buffer per tensor). Each
layer's cache has its own head count and size; a KV-sharing layer (Gemma 4) has no cache
tensors and reads its source layer's, as written in the same call.

Every part a `Decoder` may have is written (keras_hub's families: q/k/v/o biases, per-head
q/k/v norms, NoPE layers, sliding windows, soft caps, per-layer RoPE tables, post norms,
GeGLU, block output scales, the embedding scale, GPT-OSS's attention sinks (uncapped, after
the scores' soft cap) and mixture of experts (every expert run densely, as `moe_onnx`)). A
sliding window counts tokens, not slots: a key's position is the count of slots the query's
row attends to up to it, less one, so left padding inside the window does not narrow it.

A token's RoPE position is the count of slots its row of `mask` lets it attend to, less
one (itself): the count of real tokens before it, as in the ONNX file and in Keras's
`positions_from_mask`. Without padding that is `input_pos`. A query that attends to no
slot (a padding token) gets finite garbage, never NaN that would reach the cache: the
scores are masked by a select, not by adding `-inf`.

A call the cache cannot hold (`input_pos[0] < 0`, or past `max_length - sequence`:
`DYNAMIC_UPDATE_SLICE` would clamp the start and overwrite the last or first slot) or
whose `mask` lets a row see a slot after the one its token is written to returns NaN
logits and writes NaN keys and values (the row's later steps are NaN too). The graph
cannot check the rest, which the caller keeps consistent: `input_pos` consecutive, and
each real token's row of `mask` seeing its own slot `input_pos[j]` (a row that sees
fewer slots gets a smaller RoPE position and misses its own key, silently).

The module is written from the `Decoder` description with TensorFlow ops and converted
with built-in ops only (`TFLITE_BUILTINS`); a Flex op in the file is an error.
"""

from __future__ import annotations

import tempfile

import numpy as np
import tensorflow as tf

from keras_posenc.backend.tensorflow import (
    xla,  # XlaDynamicUpdateSlice: LiteRT's DYNAMIC_UPDATE_SLICE
)
from keras_posenc.export.decoder.description import (
    Attention,
    Block,
    Decoder,
    Mlp,
    Moe,
    Norm,
    Rope,
)
from keras_posenc.export.decoder.moe import GATE_FLOOR, side_by_side
from keras_posenc.export.errors import ExportError

SIGNATURES = ("prefill", "decode")
_MASKED = float(np.finfo(np.float32).min)


def cache_names(layers: list[int]) -> list[str]:
    """litert-torch's cache tensor names of `layers` (those with a cache of their own), in
    the order the signatures list them."""
    return [f"kv_cache_{kind}_{i}" for i in layers for kind in ("k", "v")]


class DecoderModule(tf.Module):
    """The `prefill` and `decode` functions of a `Decoder` (see the module docstring)."""

    def __init__(self, decoder: Decoder, unfolded_norms: bool = False):
        super().__init__(name="decoder")
        self.decoder = decoder
        self.unfolded_norms = unfolded_norms
        self.slots = decoder.max_length
        self.cached = decoder.cached_layers()
        self.prefill = tf.function(self._step, input_signature=self._specs(None), autograph=False)
        self.decode = tf.function(self._step, input_signature=self._specs(1), autograph=False)

    def _specs(self, sequence: int | None) -> list[tf.TensorSpec]:
        def cache(i: int) -> list:
            attention = self.decoder.blocks[i].attention
            return [None, attention.kv_num_heads, self.slots, attention.head_dim]

        return [
            tf.TensorSpec([None, sequence], tf.int32, name="tokens"),
            tf.TensorSpec([sequence], tf.int32, name="input_pos"),
            tf.TensorSpec([None, 1, sequence, self.slots], tf.float32, name="mask"),
            *[
                tf.TensorSpec(cache(i), tf.float32, name=f"kv_cache_{kind}_{i}")
                for i in self.cached
                for kind in ("k", "v")
            ],
        ]

    # A quantized file's norms and final soft cap keep their constants out of the weights
    # next to them (`_norm`, `_step`).
    unfolded_norms = False

    def _norm(self, x, norm: Norm):
        variance = tf.reduce_mean(tf.square(x), axis=-1, keepdims=True)
        if self.unfolded_norms:
            # The converter folds `(x * r) * scale` into the next FULLY_CONNECTED's weight
            # (`diag(scale) @ W`, which is not the weight quantized); `x * (r * scale)`
            # multiplies by no constant, so the weight stays the kernel.
            return x * (tf.math.rsqrt(variance + norm.epsilon) * norm.scale)
        return x * tf.math.rsqrt(variance + norm.epsilon) * norm.scale

    def _rotate(self, x, rope: Rope, cos_rows, sin_rows):
        """RoPE on the first `rotary_dim` channels of `x` `(batch, seq, heads, dim)`."""
        half = rope.rotary_dim // 2
        rotary, rest = x[..., : 2 * half], x[..., 2 * half :]
        # expand_dims, not `[:, :, None]`: a new-axis slice is a Flex op in LiteRT.
        c, s = tf.expand_dims(cos_rows, 2), tf.expand_dims(sin_rows, 2)
        if rope.interleaved:
            pairs = tf.reshape(rotary, tf.concat([tf.shape(rotary)[:-1], [half, 2]], 0))
            even, odd = pairs[..., 0], pairs[..., 1]
            rotated = tf.stack([even * c - odd * s, odd * c + even * s], -1)
            rotated = tf.reshape(rotated, tf.shape(rotary))
        else:
            a, b = rotary[..., :half], rotary[..., half:]
            rotated = tf.concat([a * c - b * s, b * c + a * s], -1)
        return tf.concat([rotated, rest], -1) if x.shape[-1] > 2 * half else rotated

    @staticmethod
    def _moe(h, moe: Moe):
        """The mixture of experts, every expert run densely (as `moe.moe_onnx` writes it)."""
        logits = tf.matmul(h, moe.router) + moe.router_bias
        values, indices = tf.math.top_k(logits, k=moe.top_k)
        probabilities = tf.nn.softmax(values)
        weights = tf.reduce_sum(
            tf.one_hot(indices, moe.experts) * tf.expand_dims(probabilities, -1), axis=-2
        )  # (batch, sequence, experts)
        experts, intermediate = moe.gate_bias.shape
        by_expert = tf.concat([tf.shape(h)[:2], [experts, intermediate]], 0)

        def projection(kernel, bias):
            out = tf.matmul(h, side_by_side(kernel)) + bias.reshape(-1)
            return tf.reshape(out, by_expert)

        gate = tf.clip_by_value(projection(moe.gate, moe.gate_bias), GATE_FLOOR, moe.limit)
        up = tf.clip_by_value(projection(moe.up, moe.up_bias), -moe.limit, moe.limit)
        units = (up + 1.0) * (gate * tf.sigmoid(gate * moe.alpha)) * tf.expand_dims(weights, -1)
        units = tf.reshape(units, tf.concat([tf.shape(h)[:2], [experts * intermediate]], 0))
        down = moe.down.reshape(experts * intermediate, -1)
        return tf.matmul(units, down) + tf.matmul(weights, moe.down_bias)

    @staticmethod
    def _mlp(h, mlp: Mlp | Moe):
        if isinstance(mlp, Moe):
            return DecoderModule._moe(h, mlp)
        up = tf.matmul(h, mlp.up)
        if mlp.kind == "swiglu":
            gate = tf.matmul(h, mlp.gate)
            hidden = gate * tf.sigmoid(gate) * up
        elif mlp.kind == "geglu":  # Gemma: tanh-approximated GELU of the gate, times up
            hidden = tf.nn.gelu(tf.matmul(h, mlp.gate), approximate=True) * up
        else:
            hidden = tf.nn.gelu(up, approximate=False)
        return tf.matmul(hidden, mlp.down)

    @staticmethod
    def _capped(x, cap: float):
        """`cap * tanh(x / cap)` (a soft cap), `x` itself when `cap` is 0."""
        return cap * tf.tanh(x / cap) if cap else x

    def _heads(self, h, kernel, bias, norm: Norm | None, heads: int):
        """`h @ kernel (+ bias)` as `(batch, seq, heads, head_dim)`, normed per head."""
        x = tf.matmul(h, kernel)
        if bias is not None:
            x = x + bias
        x = tf.reshape(x, [tf.shape(h)[0], tf.shape(h)[1], heads, kernel.shape[1] // heads])
        return x if norm is None else self._norm(x, norm)

    def _attention(self, h, a: Attention, caches, start, attended, rows, valid):
        """One layer: `(output, key_cache, value_cache)`, the caches written at `start`;
        `attended` `(batch, 1, seq, slots)` the slots this layer's queries see; the keys
        and values of a row not `valid` `(batch,)` written as NaN. A KV-sharing layer
        reads `caches` (its source's, written) and writes nothing."""
        batch, steps = tf.shape(h)[0], tf.shape(h)[1]
        kv_heads, head_dim, groups = a.kv_num_heads, a.head_dim, a.num_heads // a.kv_num_heads
        q = self._heads(h, a.query, a.query_bias, a.query_norm, a.num_heads)
        rope = None if a.no_rope else a.rope or self.decoder.rope  # NoPE: `rows` is None
        if rope is not None:
            q = self._rotate(q, rope, *rows)
        if a.kv_source is not None:
            key_cache, value_cache = caches
        else:
            k = self._heads(h, a.key, a.key_bias, a.key_norm, kv_heads)
            v = self._heads(h, a.value, a.value_bias, a.value_norm, kv_heads)
            if rope is not None:
                k = self._rotate(k, rope, *rows)
            at = tf.stack([0, 0, start, 0])
            # NaN, not the cache left as it was: a caller going on past NaN logits would get
            # plausible tokens from a cache missing this one. A NaN value reaches every later
            # output of the row (a masked slot's weight is 0, and 0 * NaN is NaN).
            valid = tf.reshape(valid, [-1, 1, 1, 1])
            key_cache, value_cache = (
                xla.dynamic_update_slice(
                    cache, tf.where(valid, tf.transpose(new, [0, 2, 1, 3]), np.nan), at
                )
                for cache, new in zip(caches, (k, v), strict=True)
            )
        # Query head h reads key/value head h // groups: (batch, kv, groups * steps, dim).
        q = tf.reshape(tf.transpose(q, [0, 2, 1, 3]), [batch, kv_heads, groups * steps, head_dim])
        scores = self._capped(tf.matmul(q * a.scale, key_cache, transpose_b=True), a.softcap)
        scores = tf.reshape(scores, [batch, kv_heads, groups, steps, self.slots])
        scores = tf.where(tf.expand_dims(attended, 1), scores, _MASKED)
        weights = tf.reshape(
            self._softmax(scores, a.sinks, kv_heads, groups),
            [batch, kv_heads, groups * steps, self.slots],
        )
        out = tf.reshape(tf.matmul(weights, value_cache), [batch, a.num_heads, steps, head_dim])
        out = tf.reshape(tf.transpose(out, [0, 2, 1, 3]), [batch, steps, a.num_heads * head_dim])
        out = tf.matmul(out, a.output)
        if a.output_bias is not None:
            out = out + a.output_bias
        return out, key_cache, value_cache

    @staticmethod
    def _softmax(scores, sinks, kv_heads: int, groups: int):
        """Softmax over the slots `(batch, kv, groups, steps, slots)`, with each head's
        sink logit (GPT-OSS) in the denominator: a softmax over the scores and the sink,
        the sink's own weight dropped."""
        if sinks is None:
            return tf.nn.softmax(scores)
        sink = tf.constant(sinks.reshape(1, kv_heads, groups, 1, 1), tf.float32)
        top = tf.maximum(tf.reduce_max(scores, axis=-1, keepdims=True), sink)
        exponentials = tf.exp(scores - top)
        total = tf.reduce_sum(exponentials, axis=-1, keepdims=True) + tf.exp(sink - top)
        return exponentials / total

    @staticmethod
    def _windowed(attended, window: int | None):
        """The attended slots within `window` tokens of the query (counted over the slots
        the row attends to: left padding is not a token)."""
        if window is None:
            return attended
        counts = tf.cumsum(tf.cast(attended, tf.int32), axis=-1)  # a key's position + 1
        total = counts[..., -1:]  # the query's position + 1
        return tf.logical_and(attended, total - counts < window)

    def _block(self, x, block: Block, caches, start, attended, rows, valid, layer_input):
        """`(x, key_cache, value_cache)` after one block's two residual branches;
        `attended` the slots its queries see (its window applied); `layer_input` its
        per-layer input (Gemma 4's PLE) or None."""
        out, key_cache, value_cache = self._attention(
            self._norm(x, block.attention_norm),
            block.attention,
            caches,
            start,
            attended,
            rows,
            valid,
        )
        if block.post_attention_norm is not None:
            out = self._norm(out, block.post_attention_norm)
        x = x + out
        out = self._mlp(self._norm(x, block.mlp_norm), block.mlp)
        if block.post_mlp_norm is not None:
            out = self._norm(out, block.post_mlp_norm)
        x = x + out
        gate = block.per_layer_gate
        if gate is not None:
            gated = tf.nn.gelu(tf.matmul(x, gate.gate), approximate=True) * layer_input
            x = x + self._norm(tf.matmul(gated, gate.up), gate.norm)
        if block.output_scale != 1.0:
            x = x * block.output_scale
        return x, key_cache, value_cache

    def _valid(self, tokens, start, attended):
        """`(batch,)`: the call fits the cache and no row of the mask sees a slot after
        its own (`start + j`). `fits` by a difference, not `start + sequence`, which could
        overflow int32 (`own` wraps only where `fits` is already false)."""
        steps = tf.shape(tokens)[1]
        fits = tf.logical_and(start >= 0, start <= self.slots - steps)
        own = tf.reshape(start + tf.range(steps), [1, 1, -1, 1])
        later = tf.reshape(tf.range(self.slots), [1, 1, 1, -1]) > own
        sees_later = tf.reduce_any(tf.logical_and(attended, later), axis=[1, 2, 3])
        return tf.logical_and(fits, tf.logical_not(sees_later))

    def _per_layer_inputs(self, tokens, x):
        """Gemma 4's per-layer inputs `(batch, seq, num_layers, width)` (`PerLayerInputs`)."""
        ple, layers = self.decoder.per_layer_inputs, self.decoder.num_layers
        shape = tf.concat([tf.shape(tokens), [layers, ple.width]], 0)
        embedded = tf.reshape(tf.gather(ple.embedding, tokens) * ple.embedding_scale, shape)
        projected = tf.reshape(tf.matmul(x, ple.projection) * ple.projection_scale, shape)
        return (self._norm(projected, ple.norm) + embedded) * ple.combine_scale

    def _step(self, tokens, input_pos, mask, *caches):
        decoder = self.decoder
        attended = mask >= 0  # (batch, 1, seq, slots)
        start = input_pos[0]
        valid = self._valid(tokens, start, attended)
        positions = tf.reduce_sum(tf.cast(attended, tf.int32), [1, 3]) - 1  # (batch, seq)
        positions = tf.maximum(positions, 0)  # a padding query (no slot): any row
        rows = {}  # id(Rope) -> its (cos, sin) rows at `positions`, one gather per table
        windowed = {}  # window -> the slots each query sees, one mask per width
        x = tf.gather(decoder.embedding, tokens)
        if decoder.embedding_scale != 1.0:
            x = x * decoder.embedding_scale
        per_layer = None
        if decoder.per_layer_inputs is not None:
            per_layer = self._per_layer_inputs(tokens, x)
        cache_of = {i: caches[2 * n : 2 * n + 2] for n, i in enumerate(self.cached)}
        updated = {}  # layer -> its written (key, value) caches
        for i, block in enumerate(decoder.blocks):
            rope = block.attention.rope or decoder.rope
            if id(rope) not in rows and not block.attention.no_rope:
                rows[id(rope)] = (tf.gather(rope.cos, positions), tf.gather(rope.sin, positions))
            window = block.attention.window
            if window not in windowed:
                windowed[window] = self._windowed(attended, window)
            source = block.attention.kv_source
            x, key_cache, value_cache = self._block(
                x,
                block,
                cache_of[i] if source is None else updated[source],
                start,
                windowed[window],
                rows.get(id(rope)),
                valid,
                None if per_layer is None else per_layer[:, :, i],
            )
            if source is None:
                updated[i] = (key_cache, value_cache)
        logits = tf.matmul(self._norm(x, decoder.final_norm), decoder.head)
        if decoder.head_bias is not None:
            logits = logits + decoder.head_bias
        if self.unfolded_norms:
            # The converter folds the soft cap's `logits / cap` into the head's weight
            # (`W / cap`, not the weight quantized); after the Select it reads no
            # FULLY_CONNECTED, so the weight stays the kernel.
            logits = tf.where(tf.reshape(valid, [-1, 1, 1]), logits, np.nan)
            logits = self._capped(logits, decoder.final_softcap)
        else:
            logits = self._capped(logits, decoder.final_softcap)
            logits = tf.where(tf.reshape(valid, [-1, 1, 1]), logits, np.nan)
        names = cache_names(self.cached)
        written = [cache for i in self.cached for cache in updated[i]]
        return {"logits": logits, **dict(zip(names, written, strict=True))}


def decoder_litert(decoder: Decoder, quantization=None) -> bytes:
    """The `.tflite` bytes of `decoder` (see the module docstring), built-in ops only;
    with `quantization` (a `quantized_graph.Quantization`), its projections' weights int8
    or int4 (`litert_quantize.py`).

    Raises:
        ExportError: the converter failed, or the file would need a Flex op.
    """
    if quantization is not None:
        from keras_posenc.export.decoder.litert_quantize import quantized_litert
        from keras_posenc.export.decoder.quantized_graph import (
            quantized_kernels,
            refuse_unquantizable,
        )

        refuse_unquantizable(decoder, quantization)
        kernels = quantized_kernels(decoder)
        return quantized_litert(_converted(decoder, True), kernels, quantization)
    return _converted(decoder, False)


def _converted(decoder: Decoder, unfolded_norms: bool) -> bytes:
    """`DecoderModule(decoder, unfolded_norms)` converted, built-in ops only."""
    from keras_posenc.export.litert import litert_ops
    from keras_posenc.export.quiet import converter_output

    with (
        converter_output("tensorflow", "absl"),
        tempfile.TemporaryDirectory(prefix="keras_posenc_decoder_") as folder,
    ):
        module = DecoderModule(decoder, unfolded_norms)
        signatures = {name: getattr(module, name).get_concrete_function() for name in SIGNATURES}
        tf.saved_model.save(module, folder, signatures=signatures)
        converter = tf.lite.TFLiteConverter.from_saved_model(folder, signature_keys=SIGNATURES)
        converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS]
        try:
            data = converter.convert()
        except Exception as error:
            lines = [line for line in str(error).splitlines() if "error" in line.lower()]
            raise ExportError(
                "The LiteRT converter could not convert the decoder: "
                + (lines[-1][-500:] if lines else str(error)[-500:])
            ) from error
    flex = sorted(op for op in litert_ops(data) if op.startswith("Flex"))
    if flex:
        raise ExportError(f"The decoder's LiteRT file has Flex ops: {', '.join(flex)}.")
    return data
