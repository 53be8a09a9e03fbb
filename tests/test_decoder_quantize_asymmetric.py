"""`save_decoder(quantize=..., symmetric=False)`: asymmetric blocks with zero points.

The stored bytes (integers, scales, zero points) are checked byte for byte against
onnxruntime's own quantizer with `is_symmetric=False` (`quantize_matmul_4bits` / `_8bits`,
what the genai builder runs for `int4_is_symmetric=false`), and dequantized in numpy float64
from the bytes by the formula `(q - zero) * scale`; onnxruntime's MatMulNBits,
GatherBlockQuantized and QMoE and ONNX's reference evaluator (DequantizeLinear) each on one
node against that dequantization. Whole files (GroupQueryAttention and standard ops, 4 and 8
bits, a tied embedding) are verified by `save_decoder` against the Keras model holding the
dequantized weights, zero points included; a file with one zero point changed fails it.
"""

from __future__ import annotations

import dataclasses
import shutil

import keras
import numpy as np
import onnx
import onnxruntime
import pytest
from float32_error import U, assert_within, gamma, worst_fraction
from keras_hub_models import tiny_causal_lm
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator
from onnxruntime.capi._pybind_state import quantize_matmul_4bits, quantize_matmul_8bits
from test_decoder_save import step_model

from keras_posenc.export import save_decoder
from keras_posenc.export.decoder import runtime_version, save
from keras_posenc.export.decoder.graph_builder import GraphBuilder
from keras_posenc.export.decoder.keras_reader import describe_decoder
from keras_posenc.export.decoder.progress import Progress
from keras_posenc.export.decoder.quantize import dequantize, nibbles, quantize
from keras_posenc.export.decoder.quantized_graph import Quantization
from keras_posenc.export.decoder.quantized_save import FLOAT_RUNTIME, verify_quantized_decoder
from keras_posenc.export.decoder.quantized_standard import dequantized_weight
from keras_posenc.export.errors import ExportError

MAX_LENGTH = 24  # 16 verified steps after the 8-token prompt
# QMoE's accuracy_level and GPT-OSS's sinks (the tiny GPT-OSS) need onnxruntime 1.32.
needs_qmoe = pytest.mark.skipif(
    runtime_version._installed() < runtime_version.VERIFIED_FROM,
    reason="QMoE's accuracy_level and GPT-OSS's sinks need onnxruntime 1.32",
)


def _kernel(k: int, n: int, block: int, seed: int) -> np.ndarray:
    """Random columns, and the blocks that need care: all zero, all equal (positive and
    negative: the range is widened to hold 0), all positive, and exact halves."""
    rng = np.random.default_rng(seed)
    kernel = rng.standard_normal((k, n)).astype(np.float32) * np.float32(rng.uniform(0.1, 5))
    kernel[:block, 0] = 0
    kernel[:block, 1] = 0.3
    kernel[:block, 2] = -0.3
    kernel[block : 2 * block, 3] = np.abs(kernel[block : 2 * block, 3]) + 1
    kernel[block : block + 4, 4] = [7.5, 0.5, 1.5, -2.5]
    return kernel


def _onnxruntimes(kernel: np.ndarray, bits: int, block: int):
    """onnxruntime's `(packed, scales, zero points)` of `kernel`, asymmetric."""
    k, n = kernel.shape
    blocks = k // block
    packed = np.zeros((n, blocks, block * bits // 8), np.uint8)
    scales = np.zeros((n, blocks), np.float32)
    zero = np.zeros((n, (blocks + 1) // 2 if bits == 4 else blocks), np.uint8)
    runner = quantize_matmul_4bits if bits == 4 else quantize_matmul_8bits
    runner(packed, np.ascontiguousarray(kernel), scales, zero, block, n, k, False)
    return packed, scales, zero


def _float64(stored) -> np.ndarray:
    """The `(K, N)` weight of `stored`'s bytes in float64: `(q - zero) * scale`."""
    q = stored.packed if stored.bits == 8 else nibbles(stored.packed)
    zero = stored.zero_points if stored.bits == 8 else nibbles(stored.zero_points)
    n, blocks, block = q.shape
    w = (q.astype(np.float64) - zero[:, :blocks, None]) * stored.scales[..., None]
    return w.reshape(n, blocks * block).T


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("block", [16, 32])
def test_asymmetric_blocks_are_onnxruntimes_quantizer_byte_for_byte(bits, block):
    for seed in range(4):  # 96 rows: 3 or 6 blocks, an odd count of 4-bit zero points
        kernel = _kernel(96, 7, block, seed + bits)
        with np.errstate(all="raise"):  # an all-equal block divides by nothing
            stored = quantize(kernel, bits, block, symmetric=False)
        packed, scales, zero = _onnxruntimes(kernel, bits, block)
        np.testing.assert_array_equal(stored.packed, packed)
        np.testing.assert_array_equal(stored.scales, scales)
        np.testing.assert_array_equal(stored.zero_points, zero)
        w = _float64(stored)
        np.testing.assert_array_equal(dequantize(stored), w.astype(np.float32))
        # Within one step of the kernel (half, but for the zero point's rounding and
        # clipping; the step's float32 rounding, U); the all-zero block is exact; an
        # all-equal block c is (2^bits - 1) steps of |c| / (2^bits - 1) rounded once.
        step = np.repeat(stored.scales.T, block, axis=0)
        assert np.all(np.abs(w - kernel) <= step * (1 + U))
        assert np.all(w[:block, 0] == 0) and stored.scales[0, 0] == 0
        equal = kernel[:block, 1:3].astype(np.float64)
        assert np.all(np.abs(w[:block, 1:3] - equal) <= np.abs(equal) * U)


def test_asymmetric_blocks_fit_a_one_sided_block_better_than_symmetric():
    kernel = np.linspace(1.0, 2.0, 32, dtype=np.float32)[:, None]  # all positive
    errors = [
        np.abs(dequantize(quantize(kernel, 4, 32, symmetric=s)) - kernel).max()
        for s in (True, False)
    ]
    assert errors[1] < errors[0]


def _session(model: onnx.ModelProto):
    return onnxruntime.InferenceSession(
        model.SerializeToString(), providers=["CPUExecutionProvider"]
    )


def _model(node, inputs, output, initializers, opset=21):
    graph = helper.make_graph([node], "g", inputs, [output], initializers)
    opsets = [helper.make_opsetid("", opset), helper.make_opsetid("com.microsoft", 1)]
    return helper.make_model(graph, opset_imports=opsets)


@pytest.mark.parametrize("bits", [4, 8])
def test_matmulnbits_with_zero_points_computes_the_float64_product(bits):
    k, n, block = 96, 10, 32
    stored = quantize(_kernel(k, n, block, bits), bits, block, symmetric=False)
    node = helper.make_node(
        "MatMulNBits",
        ["x", "b", "s", "z"],
        ["y"],
        domain="com.microsoft",
        K=k,
        N=n,
        bits=bits,
        block_size=block,
        accuracy_level=0,
    )
    arrays = {"b": stored.packed, "s": stored.scales, "z": stored.zero_points}
    model = _model(
        node,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, k])],
        helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, n]),
        [numpy_helper.from_array(a, name) for name, a in arrays.items()],
    )
    x = np.random.default_rng(bits).standard_normal((3, k)).astype(np.float32)
    got = _session(model).run(None, {"x": x})[0]
    w = _float64(stored)
    bound = gamma(k + 1) * (np.abs(x).astype(np.float64) @ np.abs(w))
    assert np.all(np.abs(got - x.astype(np.float64) @ w) <= bound)


@pytest.mark.parametrize("bits", [4, 8])
def test_gather_block_quantized_with_zero_points_gathers_the_float64_rows(bits):
    width, vocabulary, block = 64, 12, 32
    stored = quantize(_kernel(width, vocabulary, block, bits), bits, block, symmetric=False)
    table = stored.packed.reshape(vocabulary, -1)  # as the tied embedding reshapes it
    node = helper.make_node(
        "GatherBlockQuantized",
        ["t", "ids", "s", "z"],
        ["y"],
        domain="com.microsoft",
        bits=bits,
        block_size=block,
        gather_axis=0,
        quantize_axis=1,
    )
    arrays = {"t": table, "s": stored.scales, "z": stored.zero_points}
    model = _model(
        node,
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [5])],
        helper.make_tensor_value_info("y", TensorProto.FLOAT, [5, width]),
        [numpy_helper.from_array(a, name) for name, a in arrays.items()],
    )
    ids = np.array([0, 1, 4, 11, 4], np.int64)
    got = _session(model).run(None, {"ids": ids})[0]
    # (q - zero) * scale: one float32 rounding of the exact product.
    np.testing.assert_array_equal(got, _float64(stored).T[ids].astype(np.float32))


@pytest.mark.parametrize("bits", [4, 8])
def test_dequantize_linear_of_asymmetric_blocks_is_the_float64_weight(bits):
    stored = quantize(_kernel(96, 6, 16, bits), bits, 16, symmetric=False)
    g = GraphBuilder()
    g.standard = True
    g.node("Identity", [dequantized_weight(g, stored, "w")], ["w"])
    output = helper.make_tensor_value_info("w", TensorProto.FLOAT, [96, 6])
    model = g.model([], [output], 23, contrib=False)
    onnx.checker.check_model(model, full_check=True)
    want = _float64(stored).astype(np.float32)
    for got in (ReferenceEvaluator(model).run(None, {})[0], _session(model).run(None, {})[0]):
        np.testing.assert_array_equal(got, want)


def _save(model, folder, **options):
    return save_decoder(model, folder, max_length=MAX_LENGTH, verbose=0, symmetric=False, **options)


@pytest.fixture(scope="module")
def step():
    keras.utils.set_random_seed(0)
    model = step_model()
    return model, describe_decoder(model, MAX_LENGTH)


@pytest.fixture(scope="module")
def gqa_int4(step, tmp_path_factory):
    """The step model's int4 asymmetric GroupQueryAttention file at accuracy_level 4
    (verified also with float arithmetic), and its report."""
    folder = tmp_path_factory.mktemp("asymmetric") / "q"
    return folder, _save(step[0], folder, quantize="int4", accuracy_level=4)


def _zero_point_inputs(model: onnx.ModelProto) -> dict:
    """`{node name or op: its zero point initializer}` of every quantized node."""
    positions = {"MatMulNBits": 3, "GatherBlockQuantized": 3, "DequantizeLinear": 2}
    found = {}
    for i, node in enumerate(model.graph.node):
        if node.op_type in positions:
            inputs = list(node.input)
            found[f"{node.op_type}.{i}"] = (
                inputs[positions[node.op_type]] if len(inputs) > positions[node.op_type] else ""
            )
    return found


def test_an_asymmetric_int4_file_is_verified_with_its_zero_points(gqa_int4):
    folder, report = gqa_int4
    assert report["passed"] and report["quantization"]["symmetric"] is False
    assert report["quantization"]["judged"] == "int8-activation bound"
    assert all(FLOAT_RUNTIME in case["runtimes"] for case in report["cases"])
    zero_points = _zero_point_inputs(onnx.load(folder / "model.onnx"))
    assert len(zero_points) == 2 * 5 + 1 and all(zero_points.values())


@pytest.mark.parametrize(
    "attention,mode,level", [("gqa", "int8", 0), ("standard", "int4", 4)], ids=["gqa8", "std4"]
)
def test_int8_and_standard_op_files_are_verified(tmp_path, step, attention, mode, level):
    report = _save(
        step[0], tmp_path / "q", quantize=mode, accuracy_level=level, attention=attention
    )
    assert report["passed"] and report["quantization"]["symmetric"] is False
    zero_points = _zero_point_inputs(onnx.load(tmp_path / "q" / "model.onnx"))
    assert zero_points and all(zero_points.values())


def test_a_tied_embedding_gathers_with_the_heads_zero_points(tmp_path):
    causal_lm = tiny_causal_lm("llama", tie_word_embeddings=True)
    report = _save(causal_lm, tmp_path / "q", quantize="int4", accuracy_level=0)
    assert report["passed"] and report["quantization"]["judged"] == "float32 tolerance"
    graph = onnx.load(tmp_path / "q" / "model.onnx").graph
    gather = next(n for n in graph.node if n.op_type == "GatherBlockQuantized")
    head = [n for n in graph.node if n.op_type == "MatMulNBits"][-1]
    assert len(gather.input) == 4 and gather.input[3] == head.input[3]  # one copy


def _tamper_zero_point(model: onnx.ModelProto) -> None:
    """The first quantized node's first block's zero point one higher."""
    name = next(z for z in _zero_point_inputs(model).values() if z)
    tensor = next(t for t in model.graph.initializer if t.name == name)
    if tensor.data_type in (TensorProto.UINT4, TensorProto.INT4):  # ONNX's packed 4 bits
        raw = bytearray(tensor.raw_data)
        raw[0] = (raw[0] & 0xF0) | ((raw[0] + 1) & 0x0F)
        tensor.raw_data = bytes(raw)
        return
    array = numpy_helper.to_array(tensor).copy()
    array.reshape(-1)[0] = (array.reshape(-1)[0] & 0xF0) | ((array.reshape(-1)[0] + 1) & 0x0F)
    tensor.CopyFrom(numpy_helper.from_array(array, tensor.name))


@pytest.mark.parametrize("attention", ["gqa", "standard"])
def test_a_tampered_zero_point_fails_the_verification(tmp_path, step, gqa_int4, attention):
    model, decoder = step
    folder = tmp_path / "q"
    if attention == "gqa":
        shutil.copytree(gqa_int4[0], folder)
    else:
        _save(model, folder, quantize="int4", attention=attention, verify=False)
    tampered = onnx.load(folder / "model.onnx")
    _tamper_zero_point(tampered)
    onnx.save(tampered, folder / "model.onnx")  # beside its genai_config.json
    quantization = Quantization(4, 32, 4, symmetric=False)
    runtimes = save._runtimes(folder, ("onnx",), MAX_LENGTH, quantization)
    report = verify_quantized_decoder(
        model, decoder, False, runtimes, MAX_LENGTH, quantization, Progress(0, folder)
    )
    assert not report["passed"]
    # The float-arithmetic run of the same bytes catches it by itself.
    assert not all(case["runtimes"][FLOAT_RUNTIME]["passed"] for case in report["cases"])


@needs_qmoe
@pytest.mark.parametrize("bits", [4, 8])
def test_qmoe_with_zero_points_computes_the_dequantized_experts(bits):
    from test_decoder_quantize_moe import _moe, _qmoe_model, _run
    from test_keras_hub_gpt_oss import moe_reference

    from keras_posenc.export.decoder.moe import expert_kernels

    moe, width = _moe()
    model = _qmoe_model(moe, width, Quantization(bits, 32, 0, symmetric=False))
    node = next(n for n in model.graph.node if n.op_type == "QMoE")
    assert node.input[11] and node.input[12]  # fc1_ and fc2_zero_points
    (_, fc1), (_, fc2) = expert_kernels(0, moe)
    experts = moe.experts
    fc1 = _float64(quantize(fc1, bits, 32, symmetric=False)).reshape(experts, width, -1)
    fc2 = _float64(quantize(fc2, bits, 32, symmetric=False)).reshape(experts, -1, width)
    stored = dataclasses.replace(moe, gate=fc1[..., ::2], up=fc1[..., 1::2], down=fc2)
    x = np.random.default_rng(3).standard_normal((1, 6, width)).astype(np.float32)
    expected = moe_reference(x[0], stored, renormalized=True)
    assert_within(_run(model, x, float_arithmetic=True)[0], expected)
    _tamper_zero_point_of(model, "fc1.zero_points")
    assert worst_fraction(_run(model, x, float_arithmetic=True)[0], expected) > 10


@needs_qmoe
def test_a_gpt_oss_exports_asymmetric_experts_verified(tmp_path):
    from keras_hub_models import MAX_LENGTH as GPT_OSS_LENGTH
    from keras_hub_models import tiny_gpt_oss

    report = save_decoder(
        tiny_gpt_oss(),
        tmp_path / "q",
        max_length=GPT_OSS_LENGTH,
        verbose=0,
        quantize="int4",
        symmetric=False,
    )
    assert report["passed"] and report["quantization"]["symmetric"] is False
    graph = onnx.load(tmp_path / "q" / "model.onnx").graph
    experts = [n for n in graph.node if n.op_type == "QMoE"]
    assert experts and all(n.input[11] and n.input[12] for n in experts)


def _tamper_zero_point_of(model: onnx.ModelProto, suffix: str) -> None:
    tensor = next(t for t in model.graph.initializer if t.name.endswith(suffix))
    array = numpy_helper.to_array(tensor).copy()
    array[:, 0, :] ^= 0x11  # column 0's zero points: by 1 (4 bits) or 17 steps (8 bits)
    tensor.CopyFrom(numpy_helper.from_array(array, tensor.name))


@pytest.mark.parametrize(
    "options,error,words",
    [
        ({"quantize": "int4", "formats": ("litert",)}, ExportError, "symmetric=False"),
        ({"quantize": "int8", "formats": ("litertlm",)}, ExportError, "symmetric=False"),
        ({"quantize": None}, ValueError, "symmetric=False.*quantize=None"),
    ],
)
def test_what_cannot_take_zero_points_is_refused_before_anything_is_written(
    tmp_path, step, options, error, words
):
    with pytest.raises(error, match=words):
        _save(step[0], tmp_path / "q", **options)
    assert not (tmp_path / "q").exists()


def test_symmetric_must_be_a_bool(tmp_path, step):
    with pytest.raises(TypeError, match="symmetric must be True or False"):
        save_decoder(step[0], tmp_path / "q", max_length=MAX_LENGTH, quantize="int4", symmetric=0)
    assert not (tmp_path / "q").exists()
