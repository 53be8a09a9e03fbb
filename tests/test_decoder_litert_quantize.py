"""`save_decoder(formats=("litert",) | ("litertlm",), quantize="int8" | "int4")`: LiteRT files
whose `FULLY_CONNECTED` weights are `quantize.py`'s integers (LiteRT's rule), verified.

The rule is checked against the LiteRT converter's own dynamic-range int8 (an independent
writer of the same symmetric per-channel integers), and LiteRT's kernels (XNNPACK and the
built-in ones) against the dequantized product within the exact bound of rounding each
input row to int8. The decoder files are judged against the dequantized Keras model, and
a file with a wrong scale, nibble order or row order fails.
"""

from __future__ import annotations

import shutil
import tempfile

import keras
import numpy as np
import pytest
import tensorflow as tf
from float32_error import gamma
from tensorflow.lite.python import schema_py_generated as schema
from test_decoder_save import step_model

from keras_posenc.export import save_decoder
from keras_posenc.export.decoder import save
from keras_posenc.export.decoder.keras_reader import describe_decoder
from keras_posenc.export.decoder.litert_quantize import quantized_litert
from keras_posenc.export.decoder.progress import Progress
from keras_posenc.export.decoder.quantization_arguments import litert_quantization
from keras_posenc.export.decoder.quantize import dequantize, quantize, unpacked
from keras_posenc.export.decoder.quantized_save import verify_quantized_decoder
from keras_posenc.export.errors import ExportError

QUANTIZATIONS = {"int8": litert_quantization(8, None), "int4": litert_quantization(4, 32)}
# The step model's files: 16 greedy steps and a teacher-forced prompt of 24 (as
# tests/test_decoder_keras_quantized.py); no window, table or chunk ends between 24 and 80.
MAX_LENGTH = 24


def _one_matmul(kernel: np.ndarray, quantize_weights: bool = False) -> bytes:
    """A LiteRT file of `x @ kernel` (one FULLY_CONNECTED), with the converter's own
    dynamic-range int8 when `quantize_weights`."""
    module = tf.Module()
    module.f = tf.function(
        lambda x: {"y": tf.matmul(x, tf.constant(kernel))},
        input_signature=[tf.TensorSpec([None, kernel.shape[0]], tf.float32, name="x")],
    )
    with tempfile.TemporaryDirectory() as folder:
        tf.saved_model.save(module, folder, signatures={"f": module.f.get_concrete_function()})
        converter = tf.lite.TFLiteConverter.from_saved_model(folder)
        if quantize_weights:
            converter.optimizations = [tf.lite.Optimize.DEFAULT]
        return converter.convert()


def _fully_connected_weight(content: bytes):
    """`(model, subgraph, tensor)` of the file's one FULLY_CONNECTED weight."""
    model = schema.ModelT.InitFromPackedBuf(bytearray(content), 0)
    subgraph = model.subgraphs[0]
    for op in subgraph.operators:
        code = model.operatorCodes[op.opcodeIndex]
        if max(code.builtinCode, code.deprecatedBuiltinCode) == 9:  # FULLY_CONNECTED
            return model, subgraph, subgraph.tensors[op.inputs[1]]
    raise AssertionError("no FULLY_CONNECTED")


def test_int8_is_the_converters_per_channel_int8():
    rng = np.random.default_rng(0)
    kernel = rng.normal(0, 0.05, (96, 40)).astype(np.float32)
    model, _, tensor = _fully_connected_weight(_one_matmul(kernel, quantize_weights=True))
    assert tensor.type == schema.TensorType.INT8
    theirs = np.asarray(model.buffers[tensor.buffer].data, np.uint8).view(np.int8)
    ours = quantize(kernel, 8, None, rule="litert")
    signed = unpacked(ours).astype(np.int16).reshape(40, 96) - 128
    np.testing.assert_array_equal(signed, theirs.reshape(40, 96))
    np.testing.assert_array_equal(ours.scales[:, 0], np.asarray(tensor.quantization.scale))


@pytest.mark.parametrize("bits,block", [(8, None), (4, 32), (4, 64)])
def test_the_litert_rule_keeps_quantizes_record(bits, block):
    rng = np.random.default_rng(1)
    kernel = rng.normal(0, 0.05, (128, 24)).astype(np.float32)
    stored = quantize(kernel, bits, block, rule="litert")
    top = 2 ** (bits - 1) - 1
    assert np.all(stored.scales > 0)
    assert np.abs(unpacked(stored).astype(np.int16) - 2 ** (bits - 1)).max() == top
    if bits == 4:  # LiteRT's blockwise scales are float16
        np.testing.assert_array_equal(stored.scales, stored.scales.astype(np.float16))
    # Round to nearest: each weight within half a step of what the file stores.
    step = np.repeat(stored.scales, stored.block_size, axis=1).T
    assert np.all(np.abs(dequantize(stored) - kernel) <= step / 2 * (1 + 1e-6))


@pytest.mark.parametrize("mode", ["int8", "int4"])
@pytest.mark.parametrize("delegate", [True, False], ids=["xnnpack", "builtin"])
def test_litert_computes_the_dequantized_product(mode, delegate):
    """Within the exact bound of the per-row int8 rounding of the input (step
    `(max - min) / 255` at most, so each input moves by half of it) plus float32's."""
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    rng = np.random.default_rng(2)
    kernel = rng.normal(0, 0.05, (128, 48)).astype(np.float32)
    content = quantized_litert(_one_matmul(kernel), [("w", kernel)], QUANTIZATIONS[mode])
    _, _, tensor = _fully_connected_weight(content)
    assert tensor.type == (schema.TensorType.INT8 if mode == "int8" else schema.TensorType.INT4)
    resolver = (
        {}
        if delegate
        else {"experimental_op_resolver_type": OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES}
    )
    runner = Interpreter(model_content=content, **resolver).get_signature_runner("f")
    x = rng.normal(0, 1, (5, 128)).astype(np.float32)
    got = runner(x=x)["y"].astype(np.float64)
    stored = quantize(kernel, QUANTIZATIONS[mode].bits, QUANTIZATIONS[mode].block_size, "litert")
    w = dequantize(stored).astype(np.float64)
    step = (x.max(1) - x.min(1)).astype(np.float64) / 255
    bound = step[:, None] / 2 * np.abs(w).sum(0) + gamma(128) * (np.abs(x) @ np.abs(w))
    assert np.all(np.abs(got - x.astype(np.float64) @ w) <= bound)


def _save(model, folder, **options):
    return save_decoder(model, folder, max_length=MAX_LENGTH, verbose=0, **options)


def _quantized_weights(content: bytes) -> list:
    model = schema.ModelT.InitFromPackedBuf(bytearray(content), 0)
    return [
        t
        for t in model.subgraphs[0].tensors
        if t.type in (schema.TensorType.INT8, schema.TensorType.INT4)
    ]


@pytest.fixture(scope="module")
def seeded_step_model():
    """`(model, its weights)`: one step model for every file of this module (seed 0)."""
    keras.utils.set_random_seed(0)
    model = step_model()
    return model, [w.copy() for w in model.get_weights()]


@pytest.fixture(scope="module")
def float_litert(seeded_step_model, tmp_path_factory):
    """`(report, folder)` of the step model's float32 LiteRT file, verified."""
    folder = tmp_path_factory.mktemp("float") / "f"
    return _save(seeded_step_model[0], folder, formats=("litert",)), folder


@pytest.fixture(scope="module", params=["int8", "int4"])
def step_litert_quantized(request, seeded_step_model, tmp_path_factory):
    """`(mode, report, folder)` of the step model's quantized LiteRT file, verified: the
    export the tests below judge and tamper with (one export per mode)."""
    folder = tmp_path_factory.mktemp(request.param) / "q"
    report = _save(seeded_step_model[0], folder, formats=("litert",), quantize=request.param)
    return request.param, report, folder


def test_a_step_model_exports_to_litert_quantized_and_verified(
    seeded_step_model, float_litert, step_litert_quantized
):
    model, before = seeded_step_model
    _, report, folder = step_litert_quantized
    assert report["passed"]
    content = (folder / "model.tflite").read_bytes()
    # per layer: q, k, v, o, gate, up, down; then the head
    assert len(_quantized_weights(content)) == 2 * 7 + 1
    float_file, float_folder = float_litert
    assert float_file["passed"]
    assert len(content) < 0.6 * (float_folder / "model.tflite").stat().st_size
    for case in report["cases"]:
        runtimes = case["runtimes"]
        assert runtimes["litert"]["bound_used"] <= 1
        assert runtimes["litert, float arithmetic"]["same_tokens"]
    for was, now in zip(before, model.get_weights(), strict=True):
        np.testing.assert_array_equal(was, now)


def _edit(content: bytes, change) -> bytes:
    import flatbuffers

    model = schema.ModelT.InitFromPackedBuf(bytearray(content), 0)
    weight = next(
        t
        for t in model.subgraphs[0].tensors
        if t.type in (schema.TensorType.INT8, schema.TensorType.INT4)
    )
    change(model, model.subgraphs[0], weight)
    builder = flatbuffers.Builder(1024)
    builder.Finish(model.Pack(builder), file_identifier=b"TFL3")
    return bytes(builder.Output())


def _tamper_scale(model, subgraph, weight):
    if weight.type == schema.TensorType.INT8:
        weight.quantization.scale[0] *= 1.5
        return
    scales = subgraph.tensors[weight.quantization.details.scales]
    data = np.asarray(model.buffers[scales.buffer].data, np.uint8).view(np.float16).copy()
    data[0] *= 1.5  # one block's scale
    model.buffers[scales.buffer].data = data.view(np.uint8)


def _tamper_rows(model, subgraph, weight):
    n, k = weight.shape
    data = np.asarray(model.buffers[weight.buffer].data, np.uint8).reshape(n, -1).copy()
    data[[0, 1]] = data[[1, 0]]  # two output channels' integers swapped
    model.buffers[weight.buffer].data = data.reshape(-1)


def _tamper_nibbles(model, subgraph, weight):
    data = np.asarray(model.buffers[weight.buffer].data, np.uint8)
    model.buffers[weight.buffer].data = ((data >> 4) | (data << 4)).astype(np.uint8)


def test_a_tampered_litert_file_fails_the_verification(
    tmp_path, seeded_step_model, step_litert_quantized
):
    model = seeded_step_model[0]
    mode, _, written_folder = step_litert_quantized
    folder = shutil.copytree(written_folder, tmp_path / "q")
    decoder = describe_decoder(model, MAX_LENGTH)
    written = (folder / "model.tflite").read_bytes()
    tampers = [_tamper_scale, _tamper_rows] + ([_tamper_nibbles] if mode == "int4" else [])
    quantization = QUANTIZATIONS[mode]
    for tamper in tampers:
        (folder / "model.tflite").write_bytes(_edit(written, tamper))
        runtimes = save._runtimes(folder, ("litert",), MAX_LENGTH, quantization)
        report = verify_quantized_decoder(
            model, decoder, False, runtimes, MAX_LENGTH, quantization, Progress(0, folder)
        )
        assert not report["passed"], tamper.__name__
        float_results = [c["runtimes"]["litert, float arithmetic"] for c in report["cases"]]
        assert not all(r["passed"] for r in float_results), tamper.__name__


def test_litert_int4_blocks_that_its_kernel_cannot_take_are_refused(tmp_path):
    keras.utils.set_random_seed(0)
    with pytest.raises(ValueError, match="multiple of 32"):
        _save(step_model(), tmp_path / "q", formats=("litert",), quantize="int4", block_size=16)
    assert not (tmp_path / "q").exists()


@pytest.mark.parametrize("mode", ["int8", "int4"])
def test_a_quantized_litertlm_bundle_generates_the_references_text(tmp_path, mode):
    """LiteRT-LM's engine against keras_hub's `generate()` with the dequantized weights:
    the same text, or the texts part where the reference's margin is a near tie."""
    pytest.importorskip("litert_lm")
    from tiny_sentencepiece import tiny_llama_with_tokenizer

    causal_lm = tiny_llama_with_tokenizer()
    before = [w.copy() for w in causal_lm.get_weights()]
    report = save_decoder(
        causal_lm, tmp_path / "b", max_length=44, formats=("litertlm",), quantize=mode, verbose=0
    )
    result = report["litertlm"]
    assert result["passed"]
    assert result["quantization"]["bits"] == {"int8": 8, "int4": 4}[mode]
    for case in result["cases"]:
        assert case["keras_hub"], case  # a text to compare, not two empty ones
        if not case["equal"]:
            assert case["reference_margin"] <= 2 * case["bound"], case
    assert any(case["equal"] for case in result["cases"])
    for was, now in zip(before, causal_lm.get_weights(), strict=True):
        np.testing.assert_array_equal(was, now)


@pytest.mark.parametrize("mode,tied", [("int8", True), ("int4", False)])
def test_a_keras_hub_llama_exports_to_litert_quantized_and_verified(tmp_path, mode, tied):
    """Norm scales that are not ones (the converter would fold them into the next weight)
    and a tied table (its GATHER reads the head's dequantized weights)."""
    from keras_hub_models import tiny_causal_lm

    causal_lm = tiny_causal_lm("llama", tie_word_embeddings=tied)
    report = _save(causal_lm, tmp_path / "q", formats=("litert",), quantize=mode)
    assert report["passed"]
    content = (tmp_path / "q" / "model.tflite").read_bytes()
    assert len(_quantized_weights(content)) == 2 * 7 + 1


def test_a_mixture_of_experts_is_refused_for_a_quantized_litert_file(tmp_path):
    from keras_hub_models import tiny_gpt_oss

    with pytest.raises(ExportError, match="mixture-of-experts MLP is not supported in a LiteRT"):
        _save(tiny_gpt_oss(), tmp_path / "q", formats=("litert",), quantize="int8")
    assert not (tmp_path / "q").exists()
