"""Models Keras quantized (`causal_lm.quantize("int8" | "int4")`), exported as stored.

The reference is always the quantized Keras model itself: each stored layer's ONNX nodes
against the Keras layer's own call on the same inputs, and the whole file's logits against
the quantized CausalLM's forward pass, within the bound of the activation rounding where
the runtime rounds (`quantized_check.activation_bound`, derived in docs/quantization.md).
A file with one wrong scale or zero point fails the verification; the modes the export
cannot write are refused before anything is written.
"""

from __future__ import annotations

import dataclasses

import keras
import numpy as np
import onnx
import onnxruntime
import pytest
from float32_error import U, assert_within_bound, linear_error
from keras_hub_models import GENAI, tiny_causal_lm, tiny_gpt_oss
from keras_quantizing import assert_each_tamper_fails, without_collection_per_variable
from onnx import TensorProto, helper, numpy_helper
from test_decoder_save import step_model

from keras_posenc.export import save_decoder
from keras_posenc.export.decoder.graph_builder import GraphBuilder
from keras_posenc.export.decoder.greedy_generation import onnx_greedy
from keras_posenc.export.decoder.keras_quantized import (
    KerasInt8,
    keras_dequantized,
    read_embedding,
    read_kernel,
)
from keras_posenc.export.decoder.keras_quantized_graph import stored_embedding, stored_matmul
from keras_posenc.export.decoder.onnx_decoder import decoder_onnx
from keras_posenc.export.decoder.quantization_arguments import (
    keras_quantization,
    refuse_keras_quantized,
)
from keras_posenc.export.decoder.quantized_check import activation_bound
from keras_posenc.export.decoder.quantized_graph import Quantization
from keras_posenc.export.errors import ExportError
from keras_posenc.keras_hub import describe_causal_lm
from keras_posenc.keras_hub.private import llama_part

MAX_LENGTH = 24


@pytest.fixture(autouse=True, scope="module")
def _quantize_without_collecting():
    """Every `quantize()` here without Keras's full collection of the heap per kernel."""
    with without_collection_per_variable():
        yield


def _quantized(mode: str, **options):
    causal_lm = tiny_causal_lm("llama", **options)
    causal_lm.quantize(mode)
    return causal_lm


def _run(g: GraphBuilder, x_name: str, x: np.ndarray, out: str) -> np.ndarray:
    elem = TensorProto.INT64 if x.dtype == np.int64 else TensorProto.FLOAT
    graph = helper.make_graph(
        g.nodes,
        "layer",
        [helper.make_tensor_value_info(x_name, elem, list(x.shape))],
        [helper.make_tensor_value_info(out, TensorProto.FLOAT, None)],
        g.initializers,
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)]
    )
    model.ir_version = 10
    session = onnxruntime.InferenceSession(
        model.SerializeToString(), providers=["CPUExecutionProvider"]
    )
    return session.run(None, {x_name: x})[0]


def _projections(causal_lm):
    """`(layer, its input's shape after batch and sequence)` of every projection."""
    shapes = {"query": (64,), "key": (64,), "value": (64,), "output": (4, 16)}
    for layer in causal_lm.backbone.transformer_layers:
        attention = llama_part(layer, "attention")
        for part, shape in shapes.items():
            yield llama_part(attention, part), shape
        for part, shape in (("gate", (64,)), ("up", (64,)), ("down", (96,))):
            yield llama_part(layer, part), shape


def _node_output(stored, x: np.ndarray) -> np.ndarray:
    g = GraphBuilder()
    g.quantization = Quantization(4, 0, 0)  # float arithmetic in MatMulNBits
    out = stored_matmul(g, "x", stored, "w")
    return _run(g, "x", x.reshape(*x.shape[:2], -1), out)


@pytest.mark.parametrize("mode", ["int8", "int4"])
def test_each_stored_layer_computes_what_the_keras_layer_computes(mode):
    causal_lm = _quantized(mode)
    rng = np.random.default_rng(1)
    for layer, input_shape in _projections(causal_lm):
        stored, dequantized = read_kernel(layer, layer.name)
        assert isinstance(stored, KerasInt8) == (mode == "int8")
        x = rng.standard_normal((2, 5, *input_shape)).astype(np.float32)
        expected = keras.ops.convert_to_numpy(layer(x)).reshape(2, 5, -1).astype(np.float64)
        got = _node_output(stored, x)
        if mode == "int8":
            # The same rounding of the same inputs, an exact integer product, then one
            # Mul and one Div, each correctly rounded: at most their two roundings apart.
            assert_within_bound(got, expected, 2 * U * np.abs(expected) + 1e-30, what=layer.name)
        else:
            # (q - zero) * scale is exact-ish on both sides; two float32 products of K terms.
            flat = x.reshape(2, 5, -1).astype(np.float64)
            bound = 2 * linear_error(flat, dequantized.astype(np.float64))
            assert_within_bound(got, expected, bound + 2 * U * np.abs(expected), what=layer.name)


@pytest.mark.parametrize("mode", ["int8", "int4"])
@pytest.mark.parametrize("tied", [True, False])
def test_the_stored_embedding_and_head_compute_what_keras_computes(mode, tied):
    causal_lm = _quantized(mode, tie_word_embeddings=tied)
    embedding = causal_lm.backbone.token_embedding
    table, head, _, float_head = read_embedding(embedding, "test")
    ids = np.array([[0, 5, 99, 42], [7, 7, 1, 63]], np.int64)
    g = GraphBuilder()
    g.quantization = Quantization(4, 0, 0)
    got = _run(g, "ids", ids, stored_embedding(g, table, "ids"))
    expected = keras.ops.convert_to_numpy(embedding(ids)).astype(np.float64)
    # One division (int8) or `(q - zero) * scale` (int4) a value, each correctly rounded.
    assert_within_bound(got, expected, U * np.abs(expected) + 1e-30, what="embedding")
    hidden = np.random.default_rng(2).standard_normal((2, 3, 64)).astype(np.float32)
    logits = _node_output(table if head is None else head, hidden)
    expected = keras.ops.convert_to_numpy(embedding(hidden, reverse=True)).astype(np.float64)
    bound = 2 * linear_error(hidden.astype(np.float64), float_head.astype(np.float64))
    assert_within_bound(logits, expected, bound + 2 * U * np.abs(expected), what="head")


def _bound_and_tokens(causal_lm, path, quantization, chain: int):
    """The file's prompt logits (onnxruntime) against the quantized CausalLM's forward
    pass: every logit within the bound, the same top-1 where the margin exceeds twice it."""
    rng = np.random.default_rng(3)
    prompts = rng.integers(0, 100, (3, 12)).astype(np.int64)
    mask = np.ones_like(prompts)
    expected = keras.ops.convert_to_numpy(
        causal_lm({"token_ids": prompts, "padding_mask": mask})
    ).astype(np.float64)
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    got = onnx_greedy(session, prompts, mask, 0, MAX_LENGTH)[1][0].astype(np.float64)
    float_arithmetic = quantization.keras == "int4" and quantization.accuracy_level == 0
    if float_arithmetic:  # check.compare_greedy's float32 tolerance
        bound = 1e-5 + 1e-4 * np.sqrt(np.mean(expected**2, axis=-1, keepdims=True))
    else:  # every input of every quantized product rounded to int8 (docs/quantization.md)
        bound = activation_bound(expected, chain, quantization.block_size)
    error = np.abs(got - expected)
    assert np.all(error <= bound), float((error / bound).max())
    top2 = np.sort(expected, axis=-1)[..., -2:]
    decided = top2[..., 1] - top2[..., 0] > 2 * bound[..., 0]
    if float_arithmetic:  # the bound of int8 rounding leaves tiny models few decided tokens
        assert decided.mean() > 0.5
    agree = np.argmax(got, -1) == np.argmax(expected, -1)
    assert np.all(agree[decided])


@pytest.mark.parametrize(
    "mode,tied,level",
    [("int8", False, None), ("int8", True, None), ("int4", True, 4), ("int4", False, 0)],
)
def test_a_keras_quantized_llama_exports_as_stored_and_verified(tmp_path, mode, tied, level):
    causal_lm = _quantized(mode, tie_word_embeddings=tied)
    folder = tmp_path / "q"
    report = save_decoder(causal_lm, folder, max_length=MAX_LENGTH, verbose=0, accuracy_level=level)
    assert report["passed"] and report["quantization"]["keras"] == mode
    assert set(report["cases"][0]["runtimes"]) >= {"onnxruntime", *GENAI}
    ops = [node.op_type for node in onnx.load(folder / "model.onnx").graph.node]
    # per layer: packed q/k/v, o, gate, up, down; then the head
    product = "MatMulInteger" if mode == "int8" else "MatMulNBits"
    assert ops.count(product) == 2 * 5 + 1 and "MatMul" not in ops
    quantization = keras_quantization(
        describe_causal_lm(causal_lm, MAX_LENGTH), None, None, level, "gqa", ("onnx",)
    )
    _bound_and_tokens(causal_lm, folder / "model.onnx", quantization, 2 * 2 + 1)


def _first_layers(model, name_part: str):
    """The first initializer of the first layer's packed q/k/v named with `name_part`."""
    return next(
        t
        for t in model.graph.initializer
        if t.name.startswith("layers.0.attn.qkv_proj") and name_part in t.name
    )


@pytest.mark.parametrize("mode", ["int8", "int4", "int4 per channel", "one Dense int8"])
def test_a_keras_quantized_step_model_exports_as_stored_and_verified(tmp_path, mode):
    keras.utils.set_random_seed(0)
    model = step_model()
    if mode == "int4 per channel":  # Keras computes it as int8: (x_q @ q) / (scale s)
        model.quantize("int4", config=keras.quantizers.Int4QuantizationConfig(block_size=-1))
    elif mode == "one Dense int8":  # the other layers float32, written as float MatMuls
        next(layer for layer in model.layers if hasattr(layer, "up")).up.quantize("int8")
    else:
        model.quantize(mode)
    report = save_decoder(model, tmp_path / "q", max_length=MAX_LENGTH, verbose=0)
    assert report["passed"] and report["quantization"]["keras"] == mode.removeprefix("one Dense ")
    # Its bytes with float arithmetic judged to float32 tolerance beside the file as written.
    assert report["cases"][0]["runtimes"]["onnxruntime, accuracy_level 0"]["passed"]
    ops = [node.op_type for node in onnx.load(tmp_path / "q" / "model.onnx").graph.node]
    # per layer: packed q/k/v, o, gate, up, down; then the head. int4 per channel rounds
    # no inputs (Int4QuantizationConfig's default): a float MatMul over its integers.
    products = {"MatMulInteger": 0, "MatMulNBits": 0, "MatMul": 0}
    kind = {"int4": "MatMulNBits", "int4 per channel": "MatMul"}.get(mode, "MatMulInteger")
    products[kind] = 2 * 5 + 1
    if mode == "one Dense int8":
        products.update(MatMulInteger=1, MatMul=2 * 5)
    assert {op: ops.count(op) for op in products} == products


def _scaled(name_part: str):
    def tamper(model):
        tensor = _first_layers(model, name_part)
        array = numpy_helper.to_array(tensor).copy()
        array.reshape(-1)[0] *= 1.5
        tensor.CopyFrom(numpy_helper.from_array(array, tensor.name))

    tamper.__name__ = f"one {name_part} times 1.5"
    return tamper


def _zero_point(model):
    tensor = _first_layers(model, "weight_zp")
    array = numpy_helper.to_array(tensor).copy()
    array.reshape(-1)[0] ^= 0x01  # the first block's zero point one off
    tensor.CopyFrom(numpy_helper.from_array(array, tensor.name))


@pytest.mark.parametrize(
    "mode,tampers",
    [("int8", [_scaled("weight_scale")]), ("int4", [_scaled("weight_scales"), _zero_point])],
)
def test_a_tampered_file_fails_the_verification(tmp_path, mode, tampers):
    causal_lm = _quantized(mode, tie_word_embeddings=False)
    assert_each_tamper_fails(causal_lm, tampers, tmp_path / "q", MAX_LENGTH)


def test_the_dequantized_weights_are_what_keras_computes_with():
    """`keras_dequantized` of each stored kernel against the Keras layer's public
    `kernel` (the unpacked integers) and scales, written out here from Keras's formula."""
    causal_lm = _quantized("int4")
    layer = llama_part(causal_lm.backbone.transformer_layers[0], "down")
    stored, _ = read_kernel(layer, "test")
    q = keras.ops.convert_to_numpy(layer.kernel).astype(np.float64)  # (96, 64), -8..7
    scale = keras.ops.convert_to_numpy(layer.kernel_scale).astype(np.float64)  # (1, 64)
    zero = keras.ops.convert_to_numpy(layer.kernel_zero).astype(np.float64)
    expected = ((q - zero) * scale).astype(np.float32)
    np.testing.assert_array_equal(keras_dequantized(stored), expected)


def _float8(causal_lm):
    causal_lm.quantize("float8")


def _mixed(causal_lm):
    first, second = causal_lm.backbone.transformer_layers
    llama_part(first, "down").quantize("int8")
    config = keras.quantizers.Int4QuantizationConfig()
    llama_part(second, "down").quantize("int4", config=config)


@pytest.mark.parametrize(
    "quantize,options,words",
    [
        (_float8, {}, "'float8'"),
        (_mixed, {}, "mixes Keras quantization modes"),
        (lambda m: m.quantize("int8"), {"quantize": "int4"}, "quantized by Keras already"),
        (lambda m: m.quantize("int4"), {"attention": "standard"}, "attention='gqa'"),
        (lambda m: m.quantize("int8"), {"attention": "standard"}, "attention='standard'"),
        (lambda m: m.quantize("int8"), {"formats": ("litert",)}, "litert files are not"),
        (lambda m: m.quantize("int4"), {"formats": ("onnx", "litertlm")}, "litertlm files"),
    ],
)
def test_what_cannot_be_written_is_refused_before_anything_is_written(
    tmp_path, quantize, options, words
):
    causal_lm = tiny_causal_lm("llama")
    quantize(causal_lm)
    with pytest.raises(ExportError, match=words):
        save_decoder(causal_lm, tmp_path / "q", max_length=MAX_LENGTH, verbose=0, **options)
    assert not (tmp_path / "q").exists()


def test_a_keras_quantized_mixture_of_experts_is_refused_before_anything_is_written(tmp_path):
    # keras_hub's GPT-OSS quantized: its reader names the quantized layers it does not read.
    causal_lm = tiny_gpt_oss()
    causal_lm.quantize("int8")
    with pytest.raises(ExportError, match="quantized layers.*not read"):
        save_decoder(causal_lm, tmp_path / "q", max_length=MAX_LENGTH, verbose=0)
    assert not (tmp_path / "q").exists()
    # And a description with stored weights beside its experts, refused by name (the
    # check `keras_quantization` and `decoder_onnx` make before any node is written).
    decoder = describe_causal_lm(tiny_gpt_oss(), MAX_LENGTH)
    # (the refusal reads only that weights are stored: a placeholder stands for one)
    decoder = dataclasses.replace(decoder, stored={"layers.0.attn.q_proj": "stored"})
    with pytest.raises(ExportError, match="mixture-of-experts MLP is not yet supported"):
        refuse_keras_quantized(decoder, "gqa")
    with pytest.raises(ExportError, match="mixture-of-experts MLP is not yet supported"):
        decoder_onnx(decoder, "gqa", Quantization(8, 64, 0, keras="int8"))


def test_decoder_onnx_refuses_a_keras_quantized_model_with_standard_attention():
    decoder = describe_causal_lm(_quantized("int8"), MAX_LENGTH)
    quantization = keras_quantization(decoder, None, None, None, "gqa", ("onnx",))
    with pytest.raises(ExportError, match="attention='standard' is not yet supported"):
        decoder_onnx(decoder, "standard", quantization)
