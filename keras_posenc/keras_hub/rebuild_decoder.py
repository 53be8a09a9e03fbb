"""`rebuild(causal_lm, max_length)`: a keras_hub CausalLM as the package's own Keras decoder.

The backbone is read as the export reads it (`describe_causal_lm`), and its weights are
put into `keras.layers.Embedding`, `DecoderBlock`s, `keras.layers.RMSNormalization` and a
`keras.layers.Dense` head joined by `keras_posenc.decoder_models`: the package's exact
RoPE tables and positions from the padding mask, in Keras. `DecoderBlock` is a
Llama-style block (no biases, no q/k norms, no window, no soft caps, SwiGLU or GELU), so
only the families that have none of the `Decoder`'s optional parts but NoPE layers
(`rope_dim=0`) rebuild exactly (Llama, Llama 3, Phi-3, Mistral with a window no narrower
than `max_length`, SmolLM3 without attention biases); any other is refused naming the
parts the blocks lack.
"""

from __future__ import annotations

import keras
import numpy as np

from keras_posenc import _keras_private
from keras_posenc.decoder_block import DecoderBlock
from keras_posenc.decoder_models import decoder_models
from keras_posenc.export.decoder.description import Norm, optional_parts
from keras_posenc.export.errors import ExportError
from keras_posenc.keras_hub import families
from keras_posenc.keras_hub.backbone_reader import describe_causal_lm, family_of


def _rope_setting(causal_lm, max_length: int, owner: str) -> tuple[float, dict | None]:
    """The one `(max_wavelength, scaling)` every layer of `causal_lm` shares."""
    read_block = family_of(causal_lm).read_block
    settings = []
    for i, layer in enumerate(causal_lm.backbone.transformer_layers):
        _, rotary = read_block(layer, max_length, f"{owner} layer {i}")
        if rotary is None:  # a NoPE layer (SmolLM3): rebuilt with rope_dim=0
            continue
        setting = families.rope_settings(rotary, owner)
        if setting not in settings:
            settings.append(setting)
    if len(settings) != 1:
        raise ExportError(f"{owner}: its layers have different RoPE settings: {settings}.")
    return settings[0]


def _assign(variable, value: np.ndarray) -> None:
    variable.assign(np.asarray(value, np.float32).reshape(tuple(variable.shape)))


def _set_norm(layer: keras.layers.RMSNormalization, norm: Norm) -> None:
    _assign(layer.scale, norm.scale)


def rebuild(causal_lm, max_length: int) -> tuple[keras.Model, keras.Model]:
    """`(training model, decode-step model)` of keras_hub `causal_lm` made of the
    package's layers (see the module docstring), as `keras_posenc.decoder_models` returns
    them; the step model is what `save_decoder` exports.

    Example:

    ```python
    train, step = keras_posenc.keras_hub.rebuild(causal_lm, max_length=1024)
    save_decoder(step, "out/decoder", max_length=1024)
    ```

    Args:
        causal_lm: a keras_hub CausalLM of a registered family (`FAMILIES`), in float32.
        max_length: the step model's cache slots (prompt included).

    Raises:
        ExportError: a family part `DecoderBlock` has no form for (named), a class the
            bridge does not read, or layers with different norm epsilons or RoPE.
    """
    decoder = describe_causal_lm(causal_lm, max_length)
    owner = f"{type(causal_lm).__name__} {causal_lm.backbone.name!r}"
    # NoPE layers are DecoderBlocks with rope_dim=0; every other part is not theirs.
    parts = [part for part in optional_parts(decoder) if part != "NoPE layers"]
    if parts:
        raise ExportError(
            f"{owner} has {', '.join(parts)}, which keras_posenc's DecoderBlock does not "
            "have, so it cannot be rebuilt exactly; export the CausalLM itself with "
            "save_decoder (it writes them)."
        )
    wavelength, scaling = _rope_setting(causal_lm, max_length, owner)
    epsilons = {decoder.final_norm.epsilon}
    for block in decoder.blocks:
        epsilons |= {block.attention_norm.epsilon, block.mlp_norm.epsilon}
    if len(epsilons) != 1:
        raise ExportError(f"{owner}: its norms have different epsilons {sorted(epsilons)}.")
    (epsilon,) = epsilons
    attention = decoder.attention
    blocks = [
        DecoderBlock(
            head_dim=attention.head_dim,
            num_query_heads=attention.num_heads,
            num_key_value_heads=attention.kv_num_heads,
            intermediate_dim=block.mlp.up.shape[1],
            mlp=block.mlp.kind,
            rope_max_wavelength=wavelength,
            rope_scaling=scaling,
            **({"rope_dim": 0} if block.attention.no_rope else {}),
            layer_norm_epsilon=epsilon,
            name=f"block_{i}",
        )
        for i, block in enumerate(decoder.blocks)
    ]
    embedding = keras.layers.Embedding(decoder.vocabulary, decoder.width, name="embedding")
    final_norm = keras.layers.RMSNormalization(epsilon=epsilon, name="final_norm")
    head = keras.layers.Dense(decoder.vocabulary, use_bias=False, name="head")
    train, step = decoder_models(
        embedding, blocks, final_norm, head, max_length, name=causal_lm.backbone.name
    )
    _assign(embedding.embeddings, decoder.embedding)
    for layer, block in zip(blocks, decoder.blocks, strict=True):
        _set_norm(layer.attention_norm, block.attention_norm)
        _set_norm(layer.mlp_norm, block.mlp_norm)
        a = block.attention
        for part, kernel in (
            ("query_dense", a.query),
            ("key_dense", a.key),
            ("value_dense", a.value),
            ("output_dense", a.output),
        ):
            _assign(_keras_private.attention_part(layer.attention, part).kernel, kernel)
        if layer.gate is not None:
            _assign(layer.gate.kernel, block.mlp.gate)
        _assign(layer.up.kernel, block.mlp.up)
        _assign(layer.down.kernel, block.mlp.down)
    _set_norm(final_norm, decoder.final_norm)
    _assign(head.kernel, decoder.head)
    return train, step
