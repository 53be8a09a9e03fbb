"""Quantized Gemma (1, 2, 3) decoders: Keras-quantized as stored, and quantized at export.

Gemma's attention kernels are `(heads, width, head_dim)` (the contracted axis not leading)
and `(heads, head_dim, width)`. Keras int8 quantizes them per output channel (exported as
stored: each layer's ONNX nodes against the Keras layer's own call, the whole file against
the quantized CausalLM); Keras int4 quantizes the kernel reshaped in stored order, whose
blocks no file can hold (refused, saying why). Quantized at export (`quantize=`), the
reference is the model with each kernel replaced by what the file stores, found through
the `(heads, width, head_dim)` transposition, and in LiteRT files the final soft cap stays
out of the head's weight, so that weight is the one quantized.
"""

from __future__ import annotations

import keras
import numpy as np
import onnx
import onnxruntime
import pytest
from float32_error import U, assert_within_bound, linear_error
from keras_hub_models import tiny_causal_lm
from onnx import TensorProto, helper
from tensorflow.lite.python import schema_py_generated as schema

from keras_posenc.export import save_decoder
from keras_posenc.export.decoder.graph_builder import GraphBuilder
from keras_posenc.export.decoder.greedy_generation import onnx_greedy
from keras_posenc.export.decoder.keras_quantized import KerasInt8, read_kernel
from keras_posenc.export.decoder.keras_quantized_graph import stored_matmul
from keras_posenc.export.decoder.quantized_check import activation_bound
from keras_posenc.export.decoder.quantized_graph import Quantization
from keras_posenc.export.errors import ExportError

MAX_LENGTH = 24
SMALL_GEMMA3 = dict(num_layers=2)  # two local layers: the quantization is per layer


@pytest.fixture(scope="module")
def gemma_int8():
    causal_lm = tiny_causal_lm("gemma")
    causal_lm.quantize("int8")
    return causal_lm


def _layer_output(stored, x: np.ndarray) -> np.ndarray:
    """`stored_matmul` of `x` `(batch, seq, K)` in onnxruntime, float arithmetic."""
    g = GraphBuilder()
    g.quantization = Quantization(4, 0, 0)
    out = stored_matmul(g, "x", stored, "w")
    graph = helper.make_graph(
        g.nodes,
        "layer",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))],
        [helper.make_tensor_value_info(out, TensorProto.FLOAT, None)],
        g.initializers,
    )
    opsets = [helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)]
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = 10
    session = onnxruntime.InferenceSession(
        model.SerializeToString(), providers=["CPUExecutionProvider"]
    )
    return session.run(None, {"x": x})[0]


def _assert_layer_is_stored(layer, input_shape: tuple) -> None:
    """The stored layer's node computes what the Keras layer computes on the same inputs."""
    stored, dequantized = read_kernel(layer, layer.name)
    x = np.random.default_rng(1).standard_normal((2, 5, *input_shape)).astype(np.float32)
    expected = keras.ops.convert_to_numpy(layer(x)).reshape(2, 5, -1).astype(np.float64)
    got = _layer_output(stored, x.reshape(2, 5, -1))
    if isinstance(stored, KerasInt8) and stored.activation is not None:
        # The same rounding of the same inputs, an exact integer product, one Mul and one
        # Div, each correctly rounded: at most their two roundings apart.
        bound = 2 * U * np.abs(expected) + 1e-30
    else:  # two float32 products of K terms over the same dequantized weights
        flat = x.reshape(2, 5, -1).astype(np.float64)
        bound = 2 * linear_error(flat, dequantized.astype(np.float64)) + 2 * U * np.abs(expected)
    assert_within_bound(got, expected, bound, what=layer.name)


def test_gemmas_int8_attention_kernels_are_stored_per_output_channel(gemma_int8):
    attention = gemma_int8.backbone.transformer_layers[0].attention
    shapes = {"query_dense": (64,), "key_dense": (64,), "value_dense": (64,)}
    for name, input_shape in {**shapes, "output_dense": (4, 16)}.items():
        layer = getattr(attention, name)
        stored, _ = read_kernel(layer, name)
        assert isinstance(stored, KerasInt8) and stored.shape[0] == int(np.prod(input_shape))
        _assert_layer_is_stored(layer, input_shape)


@pytest.mark.parametrize("equation,kernel_shape", [("btd,hdn->btnh", (16, 64, 4))])
def test_int8_scales_follow_the_output_axes_not_the_kernels(equation, kernel_shape):
    """A kernel whose output axes come in the other order than in the output: each scale
    must reach its own output channel."""
    layer = keras.layers.EinsumDense(equation, output_shape=(None, 4, 16))
    layer.build((None, None, 64))
    rng = np.random.default_rng(0)
    layer.kernel.assign(rng.standard_normal(kernel_shape) * np.geomspace(0.1, 10, 4))
    layer.quantize("int8")
    _assert_layer_is_stored(layer, (64,))


def test_int4_with_one_head_is_stored_as_it_is():
    """Heads of size 1 before the contracted axis: Keras's stored-order reshape is the
    `(K, N)` matrix itself, so its blocks are exported as they are."""
    layer = keras.layers.EinsumDense("btd,ndh->btnh", output_shape=(None, 1, 16))
    layer.build((None, None, 64))
    layer.kernel.assign(np.random.default_rng(0).standard_normal((1, 64, 16)) / 8)
    layer.quantize("int4", config=keras.quantizers.Int4QuantizationConfig(block_size=32))
    _assert_layer_is_stored(layer, (64,))


def _assert_file_is_the_quantized_model(causal_lm, path, chain: int, block: int) -> None:
    """The file's prompt logits against the quantized CausalLM's forward pass, within the
    bound of int8 activation rounding; the same top-1 wherever the margin exceeds twice it."""
    prompts = np.random.default_rng(3).integers(0, 100, (2, 12)).astype(np.int64)
    mask = np.ones_like(prompts)
    expected = keras.ops.convert_to_numpy(
        causal_lm({"token_ids": prompts, "padding_mask": mask})
    ).astype(np.float64)
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    got = onnx_greedy(session, prompts, mask, 0, MAX_LENGTH)[1][0].astype(np.float64)
    bound = activation_bound(expected, chain, block)
    assert np.all(np.abs(got - expected) <= bound)
    top2 = np.sort(expected, axis=-1)[..., -2:]
    decided = top2[..., 1] - top2[..., 0] > 2 * bound[..., 0]
    assert np.all((np.argmax(got, -1) == np.argmax(expected, -1))[decided])


# Products per layer: q/k/v packed, o, gate, up, down; Gemma 3's q/k norms unpack q/k/v.
@pytest.mark.parametrize(
    "family,options,per_layer", [("gemma2", {}, 5), ("gemma3", SMALL_GEMMA3, 7)]
)
def test_a_keras_int8_gemma_exports_as_stored_and_verified(tmp_path, family, options, per_layer):
    causal_lm = tiny_causal_lm(family, **options)
    causal_lm.quantize("int8")
    folder = tmp_path / "q"
    report = save_decoder(causal_lm, folder, max_length=MAX_LENGTH, verbose=0)
    assert report["passed"] and report["quantization"]["keras"] == "int8"
    ops = [node.op_type for node in onnx.load(folder / "model.onnx").graph.node]
    assert ops.count("MatMulInteger") == 2 * per_layer + 1 and "MatMul" not in ops
    block = report["quantization"]["activation_block"]
    _assert_file_is_the_quantized_model(causal_lm, folder / "model.onnx", 2 * 2 + 1, block)


@pytest.mark.parametrize("block_size", [None, -1])
def test_a_keras_int4_gemma_is_refused_saying_why(tmp_path, block_size):
    causal_lm = tiny_causal_lm("gemma")
    config = keras.quantizers.Int4QuantizationConfig(block_size=block_size)
    causal_lm.quantize("int4", config=None if block_size is None else config)
    with pytest.raises(ExportError) as raised:
        save_decoder(causal_lm, tmp_path / "q", max_length=MAX_LENGTH, verbose=0)
    message = str(raised.value)
    assert "'query'" in message and "reshaping its kernel to (64, 64) in stored order" in message
    # Scale column (d * 16 + h) % 64 of entry (n, d, h): every head, and d % 4 changes per row.
    assert "up to 4 output channels" in message and "from one row to the next" in message
    assert not (tmp_path / "q").exists()


def test_gemma_quantized_at_export_is_verified_against_its_dequantized_weights(tmp_path):
    """Gemma's `(heads, width, head_dim)` query holds the description's `(width, heads *
    head_dim)` kernel transposed: the reference finds it and dequantizes it there."""
    causal_lm = tiny_causal_lm("gemma", intermediate_dim=128)
    before = [weight.copy() for weight in causal_lm.get_weights()]
    report = save_decoder(
        causal_lm, tmp_path / "q", max_length=MAX_LENGTH, verbose=0, quantize="int4", block_size=16
    )
    assert report["passed"]
    ops = [node.op_type for node in onnx.load(tmp_path / "q" / "model.onnx").graph.node]
    assert ops.count("MatMulNBits") == 2 * 5 + 1
    for was, now in zip(before, causal_lm.get_weights(), strict=True):
        np.testing.assert_array_equal(was, now)


def _quantized_weights(content: bytes) -> list:
    model = schema.ModelT.InitFromPackedBuf(bytearray(content), 0)
    quantized = (schema.TensorType.INT8, schema.TensorType.INT4)
    return [t for t in model.subgraphs[0].tensors if t.type in quantized]


@pytest.mark.parametrize(
    "family,mode,options",
    [("gemma2", "int8", {}), ("gemma3", "int4", SMALL_GEMMA3)],
)
def test_gemma_exports_to_litert_quantized_and_verified(tmp_path, family, mode, options):
    """Gemma 2's final soft cap (which the converter would fold into the head's weight)
    and Gemma 3's query/key norms: every projection and the tied head quantized."""
    causal_lm = tiny_causal_lm(family, **options)
    report = save_decoder(
        causal_lm,
        tmp_path / "q",
        max_length=MAX_LENGTH,
        verbose=0,
        formats=("litert",),
        quantize=mode,
    )
    assert report["passed"]
    content = (tmp_path / "q" / "model.tflite").read_bytes()
    assert len(_quantized_weights(content)) == 2 * 7 + 1


def test_a_quantized_gemma_litertlm_bundle_generates_the_references_text(tmp_path):
    pytest.importorskip("litert_lm")
    from tiny_sentencepiece import tiny_gemma_with_tokenizer

    report = save_decoder(
        tiny_gemma_with_tokenizer(),
        tmp_path / "b",
        max_length=44,
        formats=("litertlm",),
        quantize="int8",
        verbose=0,
    )
    result = report["litertlm"]
    assert result["passed"] and result["quantization"]["bits"] == 8
    for case in result["cases"]:
        assert case["keras_hub"], case
        if not case["equal"]:
            assert case["reference_margin"] <= 2 * case["bound"], case
    assert any(case["equal"] for case in result["cases"])
