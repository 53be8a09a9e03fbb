"""onnxruntime-genai's decoder interface: the names and shapes `model.onnx` is run by.

Inputs `input_ids` int64 `(batch, sequence)`, `attention_mask` int64 `(batch,
total_sequence_length)` and, per layer with a cache of its own, `past_key_values.{i}.key`
and `.value` float32 `(batch, num_key_value_heads, past_sequence_length, head_dim)`;
outputs `logits` `(batch, sequence, vocabulary)` and `present.{i}.key|value` of the
past's shape with `total_sequence_length`. The search binds one buffer per layer as both
past and present (`past_present_share_buffer`), sized by its `max_length`, and each call
writes it in place. genai finds the cached layers by these names (a KV-sharing layer has
none), as `genai_config.json`'s `inputs`/`outputs` fields say (`config_inputs`,
`config_outputs`).

Every writer of the interface reads it here: the graph's inputs and outputs
(`value_infos`), the attention emitters' cache reads and writes (`past_name`,
`present_name`), the config (`genai_config.py`) and the runners (`genai_runtime.py`).
`keras_posenc_serve` binds the same names without importing Keras, so it spells them itself.

Example:

>>> past_name(3, "key"), present_name(3, "value")
('past_key_values.3.key', 'present.3.value')
"""

from __future__ import annotations

from onnx import TensorProto, helper

from keras_posenc.export.decoder.description import Decoder

INPUT_IDS = "input_ids"
ATTENTION_MASK = "attention_mask"
LOGITS = "logits"
CACHE_KINDS = ("key", "value")
# genai_config.json's `%d` patterns (the layer's index), one per kind.
PAST_NAMES = {"key": "past_key_values.%d.key", "value": "past_key_values.%d.value"}
PRESENT_NAMES = {"key": "present.%d.key", "value": "present.%d.value"}
# One buffer per layer bound as both past and present (genai's search setting).
SHARE_BUFFER = True


def past_name(layer: int, kind: str) -> str:
    """The input holding layer `layer`'s cache of `kind` (`"key"` or `"value"`)."""
    return PAST_NAMES[kind] % layer


def present_name(layer: int, kind: str) -> str:
    """The output the layer's cache of `kind` is written to (the past's buffer)."""
    return PRESENT_NAMES[kind] % layer


def past_names(layer: int) -> list[str]:
    """`[key, value]` inputs of layer `layer`'s cache."""
    return [past_name(layer, kind) for kind in CACHE_KINDS]


def present_names(layer: int) -> list[str]:
    """`[key, value]` outputs of layer `layer`'s cache."""
    return [present_name(layer, kind) for kind in CACHE_KINDS]


def cache_shapes(kv_num_heads: int, head_dim: int) -> tuple[list, list]:
    """`(past, present)` shapes of one layer's cache: symbolic batch and lengths."""
    return (
        ["batch_size", kv_num_heads, "past_sequence_length", head_dim],
        ["batch_size", kv_num_heads, "total_sequence_length", head_dim],
    )


def value_infos(decoder: Decoder) -> tuple[list, list]:
    """The graph's `(inputs, outputs)` value infos: a cache per layer that has one (not
    the KV-sharing layers), each of its own layer's head count and size."""
    inputs = [
        helper.make_tensor_value_info(
            INPUT_IDS, TensorProto.INT64, ["batch_size", "sequence_length"]
        ),
        helper.make_tensor_value_info(
            ATTENTION_MASK, TensorProto.INT64, ["batch_size", "total_sequence_length"]
        ),
    ]
    outputs = [
        helper.make_tensor_value_info(
            LOGITS, TensorProto.FLOAT, ["batch_size", "sequence_length", decoder.vocabulary]
        )
    ]
    for i in decoder.cached_layers():
        attention = decoder.blocks[i].attention
        past, present = cache_shapes(attention.kv_num_heads, attention.head_dim)
        for kind in CACHE_KINDS:
            inputs.append(
                helper.make_tensor_value_info(past_name(i, kind), TensorProto.FLOAT, past)
            )
            outputs.append(
                helper.make_tensor_value_info(present_name(i, kind), TensorProto.FLOAT, present)
            )
    return inputs, outputs


def config_inputs() -> dict:
    """`genai_config.json`'s `model.decoder.inputs`."""
    return {
        "input_ids": INPUT_IDS,
        "attention_mask": ATTENTION_MASK,
        "past_key_names": PAST_NAMES["key"],
        "past_value_names": PAST_NAMES["value"],
    }


def config_outputs() -> dict:
    """`genai_config.json`'s `model.decoder.outputs`."""
    return {
        "logits": LOGITS,
        "present_key_names": PRESENT_NAMES["key"],
        "present_value_names": PRESENT_NAMES["value"],
    }
