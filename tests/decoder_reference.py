"""A Llama-style decoder in float64 numpy, from a step model's weights: the tests' reference.

Written from the definitions, independently of the export: RMSNorm (and the attention's
per-head q/k RMSNorms, `scale` or Gemma's `1 + scale`), RoPE from
`reference.rotary` (frequencies from the formula, plain RoPE only), grouped-query
attention over each row's real tokens, SwiGLU or GELU (erf). Each row keeps its own
list of keys and values, its tokens at positions 0, 1, ... (padding dropped).
"""

from __future__ import annotations

import math

import numpy as np
import reference


def _rms(x, scale, epsilon):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + epsilon) * scale


def _gelu(x):
    erf = np.vectorize(math.erf)
    return 0.5 * x * (1 + erf(x / math.sqrt(2)))


class ReferenceDecoder:
    """`step(tokens)` for one row: the logits of each new token, the cache kept inside."""

    def __init__(self, step_model):
        from keras_posenc import DecoderBlock

        layers = {type(layer).__name__: layer for layer in step_model.layers}
        self.embedding = np.float64(layers["Embedding"].embeddings.numpy())
        self.blocks = [layer for layer in step_model.layers if isinstance(layer, DecoderBlock)]
        self.norm = layers["RMSNormalization"]
        self.head = np.float64(layers["Dense"].kernel.numpy())
        self.keys = [[] for _ in self.blocks]
        self.values = [[] for _ in self.blocks]

    def _attention(self, i, block, h):
        attention = block.attention
        rope = attention.rotary_embedding
        q = np.einsum("sw,whd->shd", h, np.float64(attention._query_dense.kernel.numpy()))
        k = np.einsum("sw,whd->shd", h, np.float64(attention._key_dense.kernel.numpy()))
        v = np.einsum("sw,whd->shd", h, np.float64(attention._value_dense.kernel.numpy()))
        kind = attention.query_key_norm
        if kind is not None:  # the per-head RMSNorms before RoPE (all the export writes)
            assert kind in ("rms_per_head", "gemma_rms_per_head"), kind
            epsilon = attention.query_key_norm_epsilon
            q, k = (
                _rms(x, np.float64(norm.scale.numpy()) + (kind == "gemma_rms_per_head"), epsilon)
                for x, norm in ((q, attention.query_norm), (k, attention.key_norm))
            )
        start = len(self.keys[i])
        positions = np.arange(start, start + len(h))
        options = dict(max_wavelength=rope.max_wavelength, layout=rope.layout)
        options["rotary_dim"] = rope.rotary_dim
        q = reference.rotary(q[None], positions, **options)[0]
        k = reference.rotary(k[None], positions, **options)[0]
        self.keys[i].extend(k)
        self.values[i].extend(v)
        keys, values = np.stack(self.keys[i]), np.stack(self.values[i])
        groups = q.shape[1] // keys.shape[1]
        keys, values = np.repeat(keys, groups, 1), np.repeat(values, groups, 1)
        scores = np.einsum("qhd,khd->hqk", q, keys) / math.sqrt(q.shape[-1])
        causal = np.arange(len(keys))[None, :] <= positions[:, None]
        weights = reference.softmax(np.where(causal[None], scores, -np.inf))
        out = np.einsum("hqk,khd->qhd", weights, values)
        return np.einsum("qhd,hdw->qw", out, np.float64(attention._output_dense.kernel.numpy()))

    def step(self, tokens) -> np.ndarray:
        x = self.embedding[np.asarray(tokens)]
        for i, block in enumerate(self.blocks):
            eps = block.layer_norm_epsilon
            x = x + self._attention(i, block, _rms(x, block.attention_norm.scale.numpy(), eps))
            h = _rms(x, block.mlp_norm.scale.numpy(), eps)
            up = h @ np.float64(block.up.kernel.numpy())
            if block.gate is not None:
                gate = h @ np.float64(block.gate.kernel.numpy())
                hidden = gate / (1 + np.exp(-gate)) * up
            else:
                hidden = _gelu(up)
            x = x + hidden @ np.float64(block.down.kernel.numpy())
        return _rms(x, self.norm.scale.numpy(), self.norm.epsilon) @ self.head


def reference_greedy(step_model, prompts, mask, steps: int):
    """`(tokens (batch, steps + 1), logits)` as `greedy_generation.keras_greedy` returns them."""
    batch, length = prompts.shape
    tokens = np.zeros((batch, steps + 1), np.int64)
    vocabulary = ReferenceDecoder(step_model).embedding.shape[0]
    prompt_logits = np.zeros((batch, length, vocabulary))
    step_logits = np.zeros((steps, batch, prompt_logits.shape[-1]))
    for row in range(batch):
        decoder = ReferenceDecoder(step_model)
        real = mask[row].astype(bool)
        prompt_logits[row, real] = decoder.step(prompts[row, real])
        tokens[row, 0] = np.argmax(prompt_logits[row, -1])
        for s in range(steps):
            step_logits[s, row] = decoder.step([tokens[row, s]])[0]
            tokens[row, s + 1] = np.argmax(step_logits[s, row])
    return tokens, [prompt_logits, *step_logits]
