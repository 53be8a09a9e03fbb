"""`save_decoder(quantize=..., attention="standard")`: DequantizeLinear + MatMul, verified.

The stored integers are checked against `quantize.dequantize` (the one definition) through
two independent evaluators of DequantizeLinear (onnxruntime and ONNX's reference
evaluator), with and without zero points; whole files against the dequantized Keras model
(save_decoder's verification) and against ONNX's reference evaluator; a wrong scale or
zero point must fail the verification.
"""

from __future__ import annotations

import dataclasses

import keras
import numpy as np
import onnx
import onnxruntime
import pytest
from keras_hub_models import tiny_causal_lm, tiny_gpt_oss
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator
from test_decoder_save import step_model

from keras_posenc.export import save_decoder
from keras_posenc.export.decoder import runtime_version, save
from keras_posenc.export.decoder.graph_builder import GraphBuilder
from keras_posenc.export.decoder.keras_reader import describe_decoder
from keras_posenc.export.decoder.logit_tolerance import bound
from keras_posenc.export.decoder.progress import Progress
from keras_posenc.export.decoder.quantize import Quantized, dequantize, quantize, unpacked
from keras_posenc.export.decoder.quantized_graph import Quantization, quantized_kernels
from keras_posenc.export.decoder.quantized_save import FLOAT_RUNTIME, verify_quantized_decoder
from keras_posenc.export.decoder.quantized_standard import (
    FUSED_ACCURACY_LEVEL,
    dequantized_weight,
)
from keras_posenc.export.errors import ExportError

MAX_LENGTH = 24


@dataclasses.dataclass(frozen=True)
class WithZeroPoints(Quantized):
    """A record with asymmetric blocks' zero points `(N, blocks)` (the optional field)."""

    zero_points: np.ndarray | None = None


def _one_node(stored: Quantized) -> onnx.ModelProto:
    g = GraphBuilder()
    g.standard = True
    out = dequantized_weight(g, stored, "w")
    g.node("Identity", [out], ["w"])
    k, n = stored.shape
    output = helper.make_tensor_value_info("w", TensorProto.FLOAT, [k, n])
    return g.model([], [output], 23, contrib=False)


def _both(model: onnx.ModelProto) -> list[np.ndarray]:
    session = onnxruntime.InferenceSession(
        model.SerializeToString(), providers=["CPUExecutionProvider"]
    )
    return [session.run(None, {})[0], ReferenceEvaluator(model).run(None, {})[0]]


@pytest.mark.parametrize("bits", [4, 8])
def test_dequantize_linear_computes_the_records_weights(bits):
    rng = np.random.default_rng(bits)
    kernel = rng.standard_normal((64, 6)).astype(np.float32)
    stored = quantize(kernel, bits, 16)
    model = _one_node(stored)
    onnx.checker.check_model(model, full_check=True)
    types = {t.data_type for t in model.graph.initializer}
    assert (TensorProto.INT4 if bits == 4 else TensorProto.INT8) in types
    for got in _both(model):  # (q - zero) * scale, one float32 rounding: equal
        np.testing.assert_array_equal(got, dequantize(stored))
    # Zero points (the asymmetric record): q as uint, (q - z) * scale.
    q = unpacked(stored)
    zero_points = rng.integers(0, 2**bits, stored.scales.shape).astype(np.uint8)
    asymmetric = WithZeroPoints(stored.packed, stored.scales, bits, 16, zero_points)
    want = (q.astype(np.float32) - zero_points[..., None]) * stored.scales[..., None]
    want = want.astype(np.float32).reshape(6, 64).T
    model = _one_node(asymmetric)
    assert (TensorProto.UINT4 if bits == 4 else TensorProto.UINT8) in {
        t.data_type for t in model.graph.initializer
    }
    for got in _both(model):
        np.testing.assert_array_equal(got, want)


def _save(model, folder, **options):
    return save_decoder(
        model, folder, max_length=MAX_LENGTH, verbose=0, attention="standard", **options
    )


def _models():
    keras.utils.set_random_seed(0)
    return {
        "step": step_model(),
        "llama tied": tiny_causal_lm("llama", tie_word_embeddings=True),
        "llama untied": tiny_causal_lm("llama", tie_word_embeddings=False),
    }


def _optimized_types(path, work) -> dict:
    """The node types of onnxruntime's optimized model of `path` (what it fuses)."""
    options = onnxruntime.SessionOptions()
    options.optimized_model_filepath = str(work / "optimized.onnx")
    onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    optimized = onnx.load(options.optimized_model_filepath)
    types = {}
    for node in optimized.graph.node:
        types[node.op_type] = types.get(node.op_type, 0) + 1
    return types


def _check_nodes(path, decoder, tied: bool, bits: int):
    """Every quantized kernel one DequantizeLinear of int4/int8 initializers read by a
    MatMul and nothing else, no contrib op; a tied embedding its own int8 copy of the
    head's integers and scales (the same numbers; int4 widened), its rows gathered then
    dequantized; onnxruntime fuses every kernel, the head included, into MatMulNBits."""
    model = onnx.load(path)
    nodes = list(model.graph.node)
    assert all(node.domain == "" for node in nodes)
    initializers = {t.name: t for t in model.graph.initializer}
    readers = {}
    for node in nodes:
        for name in node.input:
            readers.setdefault(name, []).append(node.op_type)
    weights = [n for n in nodes if n.op_type == "DequantizeLinear" and n.input[0] in initializers]
    # Each layer's q/k/v packed in one kernel; a tied table is the head's one.
    assert len(weights) == len(quantized_kernels(decoder)) - 2 * len(decoder.blocks)
    integer = TensorProto.INT4 if bits == 4 else TensorProto.INT8
    for node in weights:
        assert initializers[node.input[0]].data_type == integer and len(node.input) == 2
        assert readers[node.output[0]] == ["MatMul"]
        for name in node.input:  # nothing else reads them: onnxruntime may fuse
            assert readers[name] == ["DequantizeLinear"], name
    embedding = next(n for n in nodes if n.op_type == "Gather" and n.input[1] == "input_ids")
    table = initializers[embedding.input[0]]
    if not tied:
        assert table.data_type == TensorProto.FLOAT
    else:
        assert table.data_type == TensorProto.INT8
        head = next(n for n in weights if n.input[0].startswith("lm_head"))
        # The same integers (int4 as int8 values) and scales, one row per token.
        rows, row_scales = (numpy_helper.to_array(initializers[x]) for x in head.input)
        gathers = [n for n in nodes if n.op_type == "Gather" and n.input[1] == "input_ids"]
        copy = {numpy_helper.to_array(initializers[n.input[0]]).dtype: n for n in gathers}
        np.testing.assert_array_equal(numpy_helper.to_array(table), rows.T.astype(np.int8))
        scales = numpy_helper.to_array(initializers[copy[np.dtype(np.float32)].input[0]])
        np.testing.assert_array_equal(scales, row_scales.T)
        dequantize_node = next(n for n in nodes if embedding.output[0] in n.input)
        assert dequantize_node.op_type == "DequantizeLinear"
    types = _optimized_types(path, path.parent)
    assert types.get("MatMulNBits") == len(weights), types
    assert "MatMul" not in types, types


@pytest.mark.parametrize("mode", ["int4", "int8"])
def test_step_model_and_keras_hub_llama_export_verified(tmp_path, mode):
    for name, model in _models().items():
        folder = tmp_path / name.replace(" ", "_")
        report = _save(model, folder, quantize=mode)
        assert report["passed"], name
        runtimes = report["cases"][1]["runtimes"]
        # The bytes with float arithmetic, to float32 tolerance (not the int8 bound).
        assert runtimes[FLOAT_RUNTIME]["within_tolerance"], name
        assert (
            "bound_used" in runtimes["onnxruntime"] and "bound_used" not in runtimes[FLOAT_RUNTIME]
        )
        if name == "step":
            decoder = describe_decoder(model, MAX_LENGTH)
        else:
            from keras_posenc import keras_hub as bridge

            decoder = bridge.describe_causal_lm(model, MAX_LENGTH)
        _check_nodes(folder / "model.onnx", decoder, name == "llama tied", int(mode[3]))


def _scalar_cumsum_axes(model: onnx.ModelProto) -> None:
    """CumSum's axis as a rank-0 tensor (the reference evaluator wants it; the file's is
    one element, which onnxruntime takes)."""
    initializers = {t.name: t for t in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "CumSum" and node.input[1] in initializers:
            axis = numpy_helper.to_array(initializers[node.input[1]]).reshape(())
            name = node.input[1] + ".scalar"
            if name not in initializers:
                initializers[name] = numpy_helper.from_array(axis, name)
                model.graph.initializer.append(initializers[name])
            node.input[1] = name


def _feeds(model: onnx.ModelProto, vocabulary: int) -> dict:
    rng = np.random.default_rng(0)
    feeds = {"input_ids": rng.integers(0, vocabulary, (2, 6)).astype(np.int64)}
    feeds["attention_mask"] = np.ones((2, 6), np.int64)
    feeds["attention_mask"][1, :2] = 0  # left padding
    for value in model.graph.input:
        if value.name.startswith("past_key_values"):
            heads, _, dim = (d.dim_value for d in value.type.tensor_type.shape.dim[1:])
            feeds[value.name] = np.zeros((2, heads, MAX_LENGTH, dim), np.float32)
    return feeds


@pytest.mark.parametrize("mode", ["int4", "int8"])
def test_onnx_reference_evaluator_agrees_with_onnxruntime(tmp_path, mode):
    causal_lm = tiny_causal_lm("llama", tie_word_embeddings=True)
    _save(causal_lm, tmp_path / "q", quantize=mode, verify=False)
    model = onnx.load(tmp_path / "q" / "model.onnx")
    feeds = _feeds(model, causal_lm.backbone.vocabulary_size)
    options = onnxruntime.SessionOptions()
    options.add_session_config_entry(FUSED_ACCURACY_LEVEL, "0")  # float arithmetic
    session = onnxruntime.InferenceSession(
        model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )
    got = session.run(["logits"], feeds)[0]
    _scalar_cumsum_axes(model)
    expected = ReferenceEvaluator(model).run(["logits"], feeds)[0]
    real = feeds["attention_mask"].astype(bool)
    error = np.abs(got - expected)[real]
    assert np.all(error <= bound(expected[real])), error.max()


def _scales(model: onnx.ModelProto):
    return next(t for t in model.graph.initializer if t.name.endswith("weight_scales"))


def _tamper_scale(model):
    scales = _scales(model)
    array = numpy_helper.to_array(scales).copy()
    array[0, 0] *= 1.5
    scales.CopyFrom(numpy_helper.from_array(array, scales.name))


def _tamper_zero_point(model):
    """A zero point of 1 (the integers' type) on the first DequantizeLinear."""
    node = next(n for n in model.graph.node if n.op_type == "DequantizeLinear")
    shape = list(_scales(model).dims)
    integers = next(t for t in model.graph.initializer if t.name == node.input[0])
    zero = helper.make_tensor("tampered_zero", integers.data_type, shape, [1] * int(np.prod(shape)))
    model.graph.initializer.append(zero)
    node.input.append("tampered_zero")


def test_a_tampered_file_fails_the_verification(tmp_path):
    keras.utils.set_random_seed(0)
    model = step_model()
    folder = tmp_path / "q"
    _save(model, folder, quantize="int4", verify=False)
    decoder = describe_decoder(model, MAX_LENGTH)
    written = onnx.load(folder / "model.onnx")
    for tamper in (_tamper_scale, _tamper_zero_point):
        tampered = onnx.ModelProto()
        tampered.CopyFrom(written)
        tamper(tampered)
        onnx.save(tampered, folder / "model.onnx")
        quantization = Quantization(4, 32, 4)
        runtimes = save._runtimes(folder, ("onnx",), MAX_LENGTH, quantization)
        report = verify_quantized_decoder(
            model, decoder, False, runtimes, MAX_LENGTH, quantization, Progress(0, folder)
        )
        assert not report["passed"], tamper.__name__
        # The float-arithmetic run of the same bytes catches it by itself.
        float_results = [c["runtimes"][FLOAT_RUNTIME] for c in report["cases"]]
        assert not all(r["passed"] for r in float_results), tamper.__name__


def test_a_mixture_of_experts_is_refused_with_standard_ops(tmp_path):
    if runtime_version._installed() < runtime_version.VERIFIED_FROM:
        pytest.skip("GPT-OSS's sinks need onnxruntime 1.32")
    with pytest.raises(ExportError, match="mixture-of-experts MLP and attention='standard'"):
        _save(tiny_gpt_oss(), tmp_path / "q", quantize="int4")
    assert not (tmp_path / "q").exists()
