"""`save_decoder(quantize=...)`: MatMulNBits' packing, the verified files, tampered files.

The packing is checked against onnxruntime's own quantizer (`quantize_matmul_4bits` /
`_8bits`, what the genai builder runs), against the MatMulNBits formula written here from
its definition, and against onnxruntime's MatMulNBits kernel on a one-node graph. A file
with a wrong scale, block order, nibble order or zero point must fail the verification.
"""

from __future__ import annotations

import keras
import numpy as np
import onnx
import onnxruntime
import pytest
from float32_error import gamma
from keras_hub_models import tiny_causal_lm
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.capi._pybind_state import quantize_matmul_4bits, quantize_matmul_8bits
from test_decoder_save import step_model

from keras_posenc.export import save_decoder
from keras_posenc.export.decoder import save
from keras_posenc.export.decoder.keras_reader import describe_decoder
from keras_posenc.export.decoder.progress import Progress
from keras_posenc.export.decoder.quantize import dequantize, quantize
from keras_posenc.export.decoder.quantized_graph import Quantization
from keras_posenc.export.decoder.quantized_save import verify_quantized_decoder
from keras_posenc.export.errors import ExportError

MAX_LENGTH = 24  # 16 verified steps after the 8-token prompt: enough to see a wrong weight


def _formula(packed: np.ndarray, scales: np.ndarray, bits: int, k: int) -> np.ndarray:
    """MatMulNBits' `B` dequantized from its definition, element by element."""
    n, blocks, _ = packed.shape
    block = k // blocks
    w = np.zeros((k, n))
    for col in range(n):
        for row in range(k):
            b, j = divmod(row, block)
            if bits == 4:
                byte = int(packed[col, b, j // 2])
                q = (byte >> 4) if j % 2 else (byte & 0x0F)
            else:
                q = int(packed[col, b, j])
            w[row, col] = (q - 2 ** (bits - 1)) * float(scales[col, b])
    return w


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("block", [16, 32])
def test_packing_is_onnxruntimes_and_the_formula(bits, block):
    rng = np.random.default_rng(bits + block)
    k, n = 64, 6
    kernel = rng.standard_normal((k, n)).astype(np.float32)
    kernel[: block // 2, 0] = 0  # an all-zero half block, and exact ties below
    kernel[block : block + 4, 1] = [8.0, 0.5, 1.5, -2.5]
    stored = quantize(kernel, bits, block)
    packed = np.zeros_like(stored.packed)
    scales = np.zeros_like(stored.scales)
    zero = np.zeros((n, (k // block + 1) // 2), np.uint8)
    runner = quantize_matmul_4bits if bits == 4 else quantize_matmul_8bits
    runner(packed, kernel, scales, zero, block, n, k, True)
    np.testing.assert_array_equal(stored.packed, packed)
    np.testing.assert_array_equal(stored.scales, scales)
    # (q - zero) * scale is exact in float64; the float32 weight is it rounded once.
    formula = _formula(packed, scales, bits, k).astype(np.float32)
    np.testing.assert_array_equal(dequantize(stored), formula)
    # Within half a step of the float kernel, a whole one where the side opposite the
    # block's largest value stops at 2^(bits-1) - 1 steps.
    step = np.repeat(np.abs(stored.scales).T, block, axis=0)
    error = np.abs(dequantize(stored) - kernel)
    clipped = np.abs(kernel) > (2 ** (bits - 1) - 0.5) * step
    assert np.all(error <= np.where(clipped, 1.0, 0.5) * step * (1 + 1e-6))


@pytest.mark.parametrize("bits", [4, 8])
def test_onnxruntimes_matmulnbits_computes_the_dequantized_product(bits):
    rng = np.random.default_rng(bits)
    k, n, block = 64, 10, 32
    kernel = rng.standard_normal((k, n)).astype(np.float32)
    x = rng.standard_normal((3, k)).astype(np.float32)
    stored = quantize(kernel, bits, block)
    node = helper.make_node(
        "MatMulNBits",
        ["x", "b", "s"],
        ["y"],
        domain="com.microsoft",
        K=k,
        N=n,
        bits=bits,
        block_size=block,
        accuracy_level=0,
    )
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, n])],
        [numpy_helper.from_array(stored.packed, "b"), numpy_helper.from_array(stored.scales, "s")],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)]
    )
    session = onnxruntime.InferenceSession(
        model.SerializeToString(), providers=["CPUExecutionProvider"]
    )
    got = session.run(None, {"x": x})[0]
    w = _formula(stored.packed, stored.scales, bits, k)
    expected = x.astype(np.float64) @ w
    bound = gamma(k) * (np.abs(x).astype(np.float64) @ np.abs(w))
    assert np.all(np.abs(got - expected) <= bound)


def _save(model, folder, **options):
    return save_decoder(model, folder, max_length=MAX_LENGTH, verbose=0, **options)


@pytest.mark.parametrize("mode", ["int4", "int8"])
def test_a_step_model_exports_quantized_and_verified(tmp_path, mode):
    keras.utils.set_random_seed(0)
    model = step_model()
    before = [w.copy() for w in model.get_weights()]
    for level in (0, 4):
        report = _save(model, tmp_path / f"{level}", quantize=mode, accuracy_level=level)
        assert report["passed"]
        onnx_model = onnx.load(tmp_path / f"{level}" / "model.onnx")
        ops = [node.op_type for node in onnx_model.graph.node]
        # per layer: packed q/k/v, o, gate, up, down; then the head
        assert ops.count("MatMulNBits") == 2 * 5 + 1 and "MatMul" not in ops
        agreement = report["cases"][1]["runtimes"]["onnxruntime"]["against_float32"]
        assert 0 <= agreement["top1_agreement"] <= 1
    # The reference's dequantized weights were the model's own for a while: given back.
    for was, now in zip(before, model.get_weights(), strict=True):
        np.testing.assert_array_equal(was, now)


@pytest.mark.parametrize("mode,tied,level", [("int4", True, 4), ("int8", False, 0)])
def test_a_keras_hub_llama_exports_quantized_and_verified(tmp_path, mode, tied, level):
    causal_lm = tiny_causal_lm("llama", tie_word_embeddings=tied)
    report = _save(causal_lm, tmp_path / "q", quantize=mode, accuracy_level=level)
    assert report["passed"]
    ops = [node.op_type for node in onnx.load(tmp_path / "q" / "model.onnx").graph.node]
    assert ("GatherBlockQuantized" in ops) == tied


def _tamper_scale(model):
    scales = next(t for t in model.graph.initializer if t.name.endswith("weight_scales"))
    array = numpy_helper.to_array(scales).copy()
    array[0, 0] *= 1.5
    scales.CopyFrom(numpy_helper.from_array(array, scales.name))


def _packed(model):
    return next(t for t in model.graph.initializer if "weight_Q" in t.name)


def _tamper_block(model):
    packed = _packed(model)
    array = numpy_helper.to_array(packed).copy()
    array[:, [0, 1]] = array[:, [1, 0]]  # each column's first two blocks swapped
    packed.CopyFrom(numpy_helper.from_array(array, packed.name))


def _tamper_nibbles(model):
    packed = _packed(model)
    array = numpy_helper.to_array(packed)
    array = ((array >> 4) | (array << 4)).astype(np.uint8)
    packed.CopyFrom(numpy_helper.from_array(array, packed.name))


def _tamper_zero_point(model):
    node = next(n for n in model.graph.node if n.op_type == "MatMulNBits")
    n = next(a.i for a in node.attribute if a.name == "N")
    blocks = next(a.i for a in node.attribute if a.name == "K") // 32
    zero = np.full((n, (blocks + 1) // 2), 0x77, np.uint8)  # 7, not the symmetric 8
    model.graph.initializer.append(numpy_helper.from_array(zero, "tampered_zero"))
    node.input.append("tampered_zero")


@pytest.mark.parametrize("level", [0, 4])
def test_a_tampered_file_fails_the_verification(tmp_path, level):
    keras.utils.set_random_seed(0)
    model = step_model()
    folder = tmp_path / "q"
    _save(model, folder, quantize="int4", accuracy_level=level, verify=False)
    decoder = describe_decoder(model, MAX_LENGTH)
    written = onnx.load(folder / "model.onnx")
    for tamper in (_tamper_scale, _tamper_block, _tamper_nibbles, _tamper_zero_point):
        tampered = onnx.ModelProto()
        tampered.CopyFrom(written)
        tamper(tampered)
        onnx.save(tampered, folder / "model.onnx")  # beside its genai_config.json
        quantization = Quantization(4, 32, level)
        # As save_decoder verifies: with int8 activations, the same bytes in float too.
        runtimes = save._runtimes(folder, ("onnx",), MAX_LENGTH, quantization)
        report = verify_quantized_decoder(
            model, decoder, False, runtimes, MAX_LENGTH, quantization, Progress(0, folder)
        )
        assert not report["passed"], tamper.__name__


@pytest.mark.parametrize(
    "options,error,words",
    [
        ({"quantize": "int2"}, ValueError, "quantize must be"),
        ({"quantize": "int4", "block_size": 24}, ValueError, "power of 2"),
        ({"quantize": "int4", "block_size": 8}, ValueError, "power of 2"),
        ({"quantize": "int4", "accuracy_level": 5}, ValueError, "accuracy_level"),
        (
            {"quantize": "int4", "attention": "standard", "accuracy_level": 0},
            ExportError,
            "carries no accuracy level",
        ),
        ({"quantize": "int8", "formats": ("onnx", "litert")}, ExportError, "cannot verify both"),
        ({"quantize": "int4", "block_size": 128}, ExportError, "not a multiple of block_size"),
    ],
)
def test_bad_settings_are_refused_before_anything_is_written(tmp_path, options, error, words):
    keras.utils.set_random_seed(0)
    with pytest.raises(error, match=words):
        _save(step_model(), tmp_path / "q", **options)
    assert not (tmp_path / "q").exists()
