"""The Llama-style decoder block (Llama, Llama 3, Mistral, Qwen2, Qwen3, Phi-3) read into a `Block`.

keras_hub writes the same block (pre-norms, a SwiGLU MLP of Dense layers, an attention of
EinsumDense `(width, heads, head_dim)` kernels with optional q/k/v biases, Qwen 3's
per-head q/k norms) under two spellings: Llama's private attributes (`private.py`) and
Phi-3's public ones. A `LlamaStyle` is a family's spelling, its sliding window and its
norm classes; `LlamaStyle.read_block` is that family's `HubFamily.read_block`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import keras

from keras_posenc.export.decoder.description import Attention, Block, Mlp
from keras_posenc.export.decoder.keras_quantized import kernel_of
from keras_posenc.export.errors import ExportError
from keras_posenc.keras_hub import private
from keras_posenc.keras_hub.layer_readers import dense_kernel, flat_bias, rms_norm


def _no_window(attention) -> None:
    return None


@dataclasses.dataclass(frozen=True)
class LlamaStyle:
    """One family's Llama-style blocks.

    Attributes:
        norms: the class names of its RMSNorms (`layer_readers.rms_norm`).
        part: `part(block or attention layer, name)`, the sublayer named `name`:
            attention_norm, attention, mlp_norm, gate, up, down (of the block), query,
            key, value, output (of the attention); Llama's private spelling by default.
        window: `window(attention layer)`, its sliding window in keras_hub's count, or
            None for none.
    """

    norms: tuple[str, ...]
    part: Callable[[object, str], object] = private.llama_part
    window: Callable[[object], int | None] = _no_window

    def read_block(self, layer, max_length: int, owner: str) -> tuple[Block, object]:
        """`(Block, the layer's rotary layer)` of a Llama-style decoder block."""
        activation = getattr(layer, "activation", None)
        if activation is None or keras.activations.serialize(activation) != "silu":
            raise ExportError(f"{owner}: the feedforward activation must be silu (SwiGLU).")
        self_attention = self.part(layer, "attention")
        attention = self._attention(self_attention, max_length, owner)
        mlp = Mlp(
            kind="swiglu",
            gate=dense_kernel(self.part(layer, "gate"), owner),
            up=dense_kernel(self.part(layer, "up"), owner),
            down=dense_kernel(self.part(layer, "down"), owner),
        )
        block = Block(
            rms_norm(self.part(layer, "attention_norm"), owner, self.norms),
            attention,
            rms_norm(self.part(layer, "mlp_norm"), owner, self.norms),
            mlp,
        )
        return block, self_attention.rotary_embedding_layer

    def _attention(self, layer, max_length: int, owner: str) -> Attention:
        window = self.window(layer)
        query_dense, key_dense, value_dense, output_dense = (
            self.part(layer, part) for part in ("query", "key", "value", "output")
        )
        query = kernel_of(query_dense, owner)  # (width, heads, head_dim)
        key = kernel_of(key_dense, owner)
        width, heads, head_dim = query.shape
        kv_heads = key.shape[1]
        if getattr(output_dense, "bias", None) is not None:
            raise ExportError(f"{owner}: an attention output bias is not exported.")
        norms = {}
        for part in ("query", "key"):
            norm_layer = private.query_key_norm(layer, part)
            norms[part] = None if norm_layer is None else rms_norm(norm_layer, owner, self.norms)
        return Attention(
            num_heads=heads,
            kv_num_heads=kv_heads,
            head_dim=head_dim,
            scale=1.0 / math.sqrt(head_dim),  # keras_hub's `_inv_norm_factor`
            query=query.reshape(width, heads * head_dim),
            key=key.reshape(width, kv_heads * head_dim),
            value=kernel_of(value_dense, owner).reshape(width, kv_heads * head_dim),
            output=kernel_of(output_dense, owner).reshape(heads * head_dim, width),
            query_bias=flat_bias(query_dense),
            key_bias=flat_bias(key_dense),
            value_bias=flat_bias(value_dense),
            query_norm=norms["query"],
            key_norm=norms["key"],
            # A window as wide as the cache masks nothing.
            window=None if window is None or window >= max_length else int(window),
        )
