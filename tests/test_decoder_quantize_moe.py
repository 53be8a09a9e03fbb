"""`save_decoder(quantize=...)` of a mixture of experts: GPT-OSS's experts as `com.microsoft.QMoE`.

The experts' packed weights are checked against onnxruntime's own quantizer
(`quantize_matmul_4bits` / `_8bits`, expert by expert: what the genai builder runs), and
onnxruntime's QMoE kernel on a one-node graph against a numpy float64 mixture of the
experts dequantized from the node's own initializers by QMoE's definition (routing: the
softmax of the top-k router logits), within float32's error bound where the kernel
computes in float (4 bits at accuracy_level 0; 8 bits with `ORT_QMOE_CPU_QNBIT_GEMM=fp32`),
and beyond it as written with int8 activations. The tiny keras_hub GPT-OSS exports int4 and
int8 verified, its router a float32 MatMul; a file with one expert block's scale times 1.5
fails the verification.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np
import onnx
import onnxruntime
import pytest
from float32_error import assert_within, worst_fraction
from keras_hub_models import MAX_LENGTH, tiny_gpt_oss
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.capi._pybind_state import quantize_matmul_4bits, quantize_matmul_8bits
from test_keras_hub_gpt_oss import moe_reference

from keras_posenc.export import save_decoder
from keras_posenc.export.decoder import runtime_version, save
from keras_posenc.export.decoder.graph_builder import GraphBuilder
from keras_posenc.export.decoder.moe import by_expert, expert_kernels, moe_contrib
from keras_posenc.export.decoder.progress import Progress
from keras_posenc.export.decoder.quantize import quantize
from keras_posenc.export.decoder.quantized_graph import Quantization
from keras_posenc.export.decoder.quantized_save import (
    QMOE_FLOAT_ARITHMETIC,
    verify_quantized_decoder,
)
from keras_posenc.export.errors import ExportError
from keras_posenc.keras_hub import describe_causal_lm

pytestmark = pytest.mark.skipif(
    runtime_version._installed() < runtime_version.VERIFIED_FROM,
    reason="GPT-OSS's sinks and QMoE's accuracy_level need onnxruntime 1.32",
)


@functools.cache
def _tiny():
    return tiny_gpt_oss()


def _moe():
    """The tiny model's second layer's experts (their clamps active: `tiny_gpt_oss`)."""
    decoder = describe_causal_lm(_tiny(), MAX_LENGTH)
    return decoder.blocks[1].mlp, decoder.width


@pytest.mark.parametrize("bits", [4, 8])
def test_expert_packing_is_onnxruntimes_quantizer_expert_by_expert(bits):
    moe, _ = _moe()
    runner = quantize_matmul_4bits if bits == 4 else quantize_matmul_8bits
    for (_, kernel), per_expert in zip(
        expert_kernels(1, moe), (moe.gate.shape[1], moe.down.shape[1]), strict=True
    ):
        weights, scales = by_expert(quantize(kernel, bits, 32), moe.experts)
        k, n = per_expert, kernel.shape[1]
        for e, expert in enumerate(kernel.reshape(moe.experts, k, n)):
            packed = np.zeros((n, k // 32, 32 * bits // 8), np.uint8)
            want = np.zeros((n, k // 32), np.float32)
            zero = np.zeros((n, (k // 32 + 1) // 2), np.uint8)
            runner(packed, np.ascontiguousarray(expert), want, zero, 32, n, k, True)
            np.testing.assert_array_equal(weights[e], packed.reshape(n, -1))
            np.testing.assert_array_equal(scales[e], want)


def _qmoe_model(moe, width: int, quantization: Quantization) -> onnx.ModelProto:
    """One QMoE, `x (batch, sequence, width) -> y`, as `save_decoder` writes it."""
    g = GraphBuilder()
    g.quantization = quantization
    g.node("Identity", [moe_contrib(g, 0, "x", moe)], ["y"])
    shape = ["batch", "sequence", width]
    return g.model(
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)],
        21,
    )


def _run(model, x: np.ndarray, float_arithmetic: bool = False) -> np.ndarray:
    """`model`'s output for `x`; `float_arithmetic`: as the verification's float runtime
    runs it (accuracy_level 0, and `QMOE_FLOAT_ARITHMETIC` for 8 bits)."""
    with pytest.MonkeyPatch.context() as patch:
        if float_arithmetic:
            model = onnx.ModelProto.FromString(model.SerializeToString())
            node = next(n for n in model.graph.node if n.op_type == "QMoE")
            (level,) = (a for a in node.attribute if a.name == "accuracy_level")
            level.i = 0
            patch.setenv(*QMOE_FLOAT_ARITHMETIC)  # read when the session is made
        session = onnxruntime.InferenceSession(
            model.SerializeToString(), providers=["CPUExecutionProvider"]
        )
    return session.run(None, {"x": x})[0]


def _definition(model, part: str, bits: int, block: int) -> np.ndarray:
    """An expert weight `(experts, K, N)` dequantized from the QMoE node's initializers by
    the op's definition: `weights[e, n]` the K values `bits` at a time, the lowest bits
    first; `(q - 2^(bits-1)) · scales[e, n, k // block]`."""
    arrays = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    node = next(n for n in model.graph.node if n.op_type == "QMoE")
    index = {"fc1": 2, "fc2": 5}[part]
    weights, scales = arrays[node.input[index]], arrays[node.input[index + 1]]
    experts, n, _ = weights.shape
    k = scales.shape[2] * block
    w = np.zeros((experts, k, n))
    for e in range(experts):
        for column in range(n):
            for row in range(k):
                if bits == 4:
                    byte = int(weights[e, column, row // 2])
                    q = byte >> 4 if row % 2 else byte & 0x0F
                else:
                    q = int(weights[e, column, row])
                w[e, row, column] = (q - 2 ** (bits - 1)) * float(scales[e, column, row // block])
    return w


@pytest.mark.parametrize("bits,level", [(4, 0), (4, 4), (8, 0)])
def test_qmoe_computes_the_dequantized_experts(bits, level):
    moe, width = _moe()
    model = _qmoe_model(moe, width, Quantization(bits, 32, level))
    fc1, fc2 = (_definition(model, part, bits, 32) for part in ("fc1", "fc2"))
    stored = dataclasses.replace(moe, gate=fc1[..., ::2], up=fc1[..., 1::2], down=fc2)
    x = np.random.default_rng(3).standard_normal((1, 6, width)).astype(np.float32)
    gate = np.einsum("tw,ewi->tei", x[0], stored.gate) + moe.gate_bias
    up = np.einsum("tw,ewi->tei", x[0], stored.up) + moe.up_bias
    assert (gate > moe.limit).any() and (np.abs(up) > moe.limit).any()  # GPT-OSS's clamps
    expected = moe_reference(x[0], stored, renormalized=True)
    # 4 bits at level 0 compute in float32; 8 bits only with the environment variable.
    assert_within(_run(model, x, float_arithmetic=bits == 8 or level == 4)[0], expected)
    if bits == 8 or level == 4:
        # As written, the experts' inputs are rounded to int8: far beyond float32's bound.
        assert worst_fraction(_run(model, x)[0], expected) > 10


def _save(folder, **options):
    return save_decoder(_tiny(), folder, max_length=MAX_LENGTH, verbose=0, **options)


@pytest.mark.parametrize("mode,level", [("int4", 4), ("int8", 0)])
def test_a_gpt_oss_exports_quantized_and_verified(tmp_path, mode, level):
    report = _save(tmp_path / "q", quantize=mode, accuracy_level=level)
    assert report["passed"]
    # int8 experts have int8 activations at every level: judged by the bound, and the
    # same bytes with float arithmetic to float32 tolerance.
    assert report["quantization"]["judged"] == "int8-activation bound"
    for case in report["cases"]:
        assert "onnxruntime, accuracy_level 0" in case["runtimes"]
    graph = onnx.load(tmp_path / "q" / "model.onnx").graph
    ops = [node.op_type for node in graph.node]
    # per layer: the packed q/k/v, o and the experts; the head; the routers stay float32
    assert ops.count("QMoE") == 2 and "MoE" not in ops
    assert ops.count("MatMulNBits") == 2 * 2 + 1 and ops.count("MatMul") == 2
    node = next(n for n in graph.node if n.op_type == "QMoE")
    attributes = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    assert attributes["expert_weight_bits"] == int(mode[3:])
    assert attributes["block_size"] == 32 and attributes["accuracy_level"] == level


def _tamper_expert_scale(model):
    scales = next(t for t in model.graph.initializer if t.name.endswith("fc1.scales"))
    array = numpy_helper.to_array(scales).copy()
    array[:, 0, 0] *= 1.5  # each expert's first gate column, its first block
    scales.CopyFrom(numpy_helper.from_array(array, scales.name))


@pytest.mark.parametrize("mode,level", [("int4", 0), ("int4", 4), ("int8", 0)])
def test_a_tampered_expert_scale_fails_the_verification(tmp_path, mode, level):
    folder = tmp_path / "q"
    _save(folder, quantize=mode, accuracy_level=level, verify=False)
    model = onnx.load(folder / "model.onnx")
    _tamper_expert_scale(model)
    onnx.save(model, folder / "model.onnx")  # beside its genai_config.json
    quantization = Quantization(int(mode[3:]), 32, level)
    runtimes = save._runtimes(folder, ("onnx",), MAX_LENGTH, quantization)
    decoder = describe_causal_lm(_tiny(), MAX_LENGTH)
    report = verify_quantized_decoder(
        _tiny(), decoder, True, runtimes, MAX_LENGTH, quantization, Progress(0, folder)
    )
    assert not report["passed"]


def test_an_expert_width_not_a_whole_number_of_blocks_is_refused(tmp_path):
    # The intermediate size 96 is not a multiple of 64 (the width 64 is).
    with pytest.raises(ExportError, match=r"layers\.0\.moe fc2 \(down\).*K=96"):
        _save(tmp_path / "q", quantize="int4", block_size=64)
    assert not (tmp_path / "q").exists()
