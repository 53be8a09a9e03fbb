"""Models Keras quantized with GPTQ / AWQ, exported as stored (`keras_gptq.py`).

Keras 3.15.1's `model.quantize("gptq" | "awq", config)` calibrates through hooks on each
layer's `call`, which a quantized layer's `__call__` does not run (it runs
`quantized_call`): the Hessians and activation magnitudes stay zero, activation order is
then the identity and AWQ's statistics empty. So the layers here are calibrated as that
loop does it, one at a time, with Keras's own `GPTQ` / `AWQ` objects fed activations of
unequal, shuffled column magnitudes: activation order permutes rows across groups, AWQ's
scales differ per input channel. The reference is the quantized Keras model itself, as in
tests/test_decoder_keras_quantized.py; a file with a wrong row order, AWQ scale or zero
point fails the verification; what cannot be written exactly is refused by name.
"""

from __future__ import annotations

import keras
import numpy as np
import onnx
import pytest
from float32_error import U, assert_within_bound, linear_error
from keras.src.quantizers.awq import AWQ  # not public: the per-layer calibration
from keras.src.quantizers.gptq import GPTQ
from keras_hub_models import tiny_causal_lm
from keras_quantizing import assert_each_tamper_fails
from onnx import numpy_helper
from test_decoder_keras_quantized import MAX_LENGTH, _bound_and_tokens, _node_output
from test_decoder_save import step_model

from keras_posenc.export import save_decoder
from keras_posenc.export.decoder.keras_gptq import KerasGrouped
from keras_posenc.export.decoder.keras_quantized import read_kernel
from keras_posenc.export.decoder.quantization_arguments import keras_quantization
from keras_posenc.export.errors import ExportError
from keras_posenc.keras_hub import describe_causal_lm
from keras_posenc.keras_hub.private import llama_part


def _config(mode: str, **options):
    if mode == "gptq":  # the calibration data is fed per layer (`_calibrate`), not read
        return keras.quantizers.GPTQConfig(dataset=[0], tokenizer=object(), **options)
    return keras.quantizers.AWQConfig(dataset=[0], tokenizer=object(), **options)


def _calibrate(layers: list, mode: str, config, seed: int = 0) -> None:
    """Keras's per-layer GPTQ / AWQ of `layers`, which share one input (q/k/v do): rows
    of unequal magnitudes, in a shuffled order."""
    rng = np.random.default_rng(seed)
    x = None
    for layer in layers:
        layer.quantize(mode, config=config)
        quantizer = (GPTQ if mode == "gptq" else AWQ)(layer, config)
        if x is None:
            magnitudes = rng.permutation(np.geomspace(0.05, 5, quantizer.rows))
            x = (rng.standard_normal((32, quantizer.rows)) * magnitudes).astype(np.float32)
        if mode == "gptq":
            quantizer.update_hessian_with_batch(x)
            quantizer.quantize_and_correct_layer()
        else:
            quantizer.update_activation_magnitudes(x)
            quantizer.quantize_layer()


def _llama_layers(causal_lm) -> list[list]:
    """The first block's projections, grouped by input: q/k/v, o, gate/up, down."""
    block = causal_lm.backbone.transformer_layers[0]
    attention = llama_part(block, "attention")
    return [
        [llama_part(attention, part) for part in ("query", "key", "value")],
        [llama_part(attention, "output")],
        [llama_part(block, "gate"), llama_part(block, "up")],
        [llama_part(block, "down")],
    ]


def _quantized_llama(mode: str, **options):
    """A tiny Llama whose first block Keras quantized (`mode`, groups of 16); the second
    block stays float32 (written as float MatMuls)."""
    causal_lm = tiny_causal_lm("llama", tie_word_embeddings=False)
    config = _config(mode, group_size=16, **options)
    for seed, layers in enumerate(_llama_layers(causal_lm)):
        _calibrate(layers, mode, config, seed)
    return causal_lm


@pytest.fixture(scope="module")
def gptq_llama():
    return _quantized_llama("gptq", activation_order=True)


@pytest.fixture(scope="module")
def awq_llama():
    return _quantized_llama("awq")


def _keras_formula(layer) -> np.ndarray:
    """The float `(K, N)` kernel, written out from Keras's variables and formula:
    `(q - zero[g]) * scale[g]` (`g = int(g_idx)`), AWQ's then divided by `awq_scales`."""
    n = layer.kernel_scale.shape[0]
    packed = keras.ops.convert_to_numpy(layer.quantized_kernel)
    q = keras.ops.convert_to_numpy(
        keras.quantizers.unpack_int4(packed, n, axis=0, dtype="uint8")
    ).astype(np.float32)
    groups = keras.ops.convert_to_numpy(layer.g_idx).astype(np.int32)
    scale = keras.ops.convert_to_numpy(layer.kernel_scale)[:, groups]
    zero = keras.ops.convert_to_numpy(layer.kernel_zero)[:, groups].astype(np.float32)
    w = ((q - zero) * scale).T
    if layer.quantization_mode == "awq":
        w = w / keras.ops.convert_to_numpy(layer.awq_scales)[:, None]
    return w.astype(np.float32)


@pytest.mark.parametrize("mode", ["gptq", "awq"])
def test_each_stored_layer_computes_what_the_keras_layer_computes(mode, request):
    causal_lm = request.getfixturevalue(f"{mode}_llama")
    rng = np.random.default_rng(1)
    reordered = 0
    for layers in _llama_layers(causal_lm):
        for layer in layers:
            stored, dequantized = read_kernel(layer, layer.name)
            assert isinstance(stored, KerasGrouped) and stored.mode == mode
            np.testing.assert_array_equal(
                dequantized.reshape(-1), _keras_formula(layer).reshape(-1)
            )
            assert (stored.divisor is not None) == (mode == "awq")
            reordered += stored.order is not None
            x = rng.standard_normal((2, 5, dequantized.shape[0])).astype(np.float32)
            keras_x = x.reshape(2, 5, 4, 16) if layer.name == "attention_output" else x
            expected = keras.ops.convert_to_numpy(layer(keras_x)).reshape(2, 5, -1)
            got = _node_output(stored, x)
            # Both sides are float32 products of K terms (within linear_error of the
            # exact one each); AWQ's division is of the input here, of the weight in
            # Keras: one more rounding of each term on either side.
            magnitude = np.abs(x.astype(np.float64)) @ np.abs(dequantized.astype(np.float64))
            bound = 2 * linear_error(x.astype(np.float64), dequantized.astype(np.float64))
            bound += 2 * U * magnitude + 2 * U * np.abs(expected)
            assert_within_bound(got, expected.astype(np.float64), bound, what=layer.name)
    if mode == "gptq":  # activation order moved rows across groups in every layer
        assert reordered == 7


@pytest.mark.parametrize("mode,level", [("gptq", 4), ("awq", 0)])
def test_a_keras_quantized_llama_exports_as_stored_and_verified(tmp_path, mode, level, request):
    causal_lm = request.getfixturevalue(f"{mode}_llama")
    folder = tmp_path / "q"
    report = save_decoder(causal_lm, folder, max_length=MAX_LENGTH, verbose=0, accuracy_level=level)
    assert report["passed"] and report["quantization"]["keras"] == mode
    if level == 4:  # its bytes with float arithmetic, judged to float32 tolerance
        assert report["cases"][0]["runtimes"]["onnxruntime, accuracy_level 0"]["passed"]
    ops = [node.op_type for node in onnx.load(folder / "model.onnx").graph.node]
    # The first block: q/k/v (GPTQ: one input order, one product; AWQ: q, k, v divided
    # by scales of their own, three products concatenated), o, gate, up, down. The
    # second block and the head: float MatMuls.
    nbits = 1 + 4 if mode == "gptq" else 3 + 4
    assert ops.count("MatMulNBits") == nbits and ops.count("MatMul") == 5 + 1
    assert ops.count("Concat") >= (mode == "awq")
    if mode == "gptq":  # one input order a product: the rows gathered before each
        assert ops.count("Gather") == 1 + 5  # the embedding's, and the five
    else:
        assert ops.count("Div") >= 7
    decoder = describe_causal_lm(causal_lm, MAX_LENGTH)
    quantization = keras_quantization(decoder, None, None, level, "gqa", ("onnx",))
    _bound_and_tokens(causal_lm, folder / "model.onnx", quantization, 2 * 2 + 1)


def _initializer(model, name_part: str):
    """The first block's q/k/v initializer named with `name_part`."""
    return next(
        t
        for t in model.graph.initializer
        if t.name.startswith("layers.0.attn.qkv_proj") and name_part in t.name
    )


def _tampered(name_part: str, change):
    def tamper(model):
        tensor = _initializer(model, name_part)
        array = numpy_helper.to_array(tensor).copy()
        change(array.reshape(-1))
        tensor.CopyFrom(numpy_helper.from_array(array, tensor.name))

    tamper.__name__ = name_part
    return tamper


def _rows_swapped(order):  # two rows of other groups: each takes the other's block
    order[[0, -1]] = order[[-1, 0]]


def _times(factor):
    def change(array):
        array[0] *= factor

    return change


def _one_off(array):
    array[0] ^= 0x01


@pytest.mark.parametrize(
    "mode,tampers",
    [
        ("gptq", [_tampered("input_order", _rows_swapped), _tampered("weight_zp", _one_off)]),
        ("awq", [_tampered("awq_scales", _times(1.5)), _tampered("weight_zp", _one_off)]),
    ],
)
def test_a_tampered_file_fails_the_verification(tmp_path, mode, tampers, request):
    causal_lm = request.getfixturevalue(f"{mode}_llama")
    assert_each_tamper_fails(causal_lm, tampers, tmp_path / "q", MAX_LENGTH)


def _step_model():
    keras.utils.set_random_seed(0)
    model = step_model()
    return model, [layer for layer in model.layers if hasattr(layer, "up")]


def test_a_keras_quantized_step_model_exports_as_stored_and_verified(tmp_path):
    """8-bit GPTQ, one group a channel (one block of the next power of 2, padded); one
    layer left uncalibrated, which Keras computes with its float kernel: a float MatMul."""
    model, blocks = _step_model()
    config = _config("gptq", weight_bits=8, group_size=-1)
    _calibrate([blocks[0].gate, blocks[0].up], "gptq", config)
    _calibrate([blocks[0].down], "gptq", config)
    blocks[1].down.quantize("gptq", config=config)  # never calibrated
    report = save_decoder(model, tmp_path / "q", max_length=MAX_LENGTH, verbose=0)
    assert report["passed"] and report["quantization"]["keras"] == "gptq"
    assert report["quantization"]["bits"] == 8
    assert report["cases"][0]["runtimes"]["onnxruntime, accuracy_level 0"]["passed"]
    graph = onnx.load(tmp_path / "q" / "model.onnx").graph
    nbits = [node for node in graph.node if node.op_type == "MatMulNBits"]
    assert len(nbits) == 3
    attributes = {a.name: a.i for a in nbits[-1].attribute}
    assert (attributes["bits"], attributes["K"], attributes["block_size"]) == (8, 96, 128)


def _regrouped(layer):
    """One row of the first group moved to the second: groups of 15 and 17 rows."""
    g_idx = keras.ops.convert_to_numpy(layer.g_idx).copy()
    g_idx[np.flatnonzero(np.trunc(g_idx) == 0)[0]] = 1.0
    layer.g_idx.assign(g_idx)


@pytest.mark.parametrize(
    "group,change,words",
    [
        (16, _regrouped, "not a permutation of whole blocks of 16"),
        (24, None, "groups of 24 rows, not a power of 2"),
    ],
)
def test_what_cannot_be_written_is_refused_before_anything_is_written(
    tmp_path, group, change, words
):
    model, blocks = _step_model()
    _calibrate([blocks[0].down], "gptq", _config("gptq", group_size=group))
    if change is not None:
        change(blocks[0].down)
    with pytest.raises(ExportError, match=words):
        save_decoder(model, tmp_path / "q", max_length=MAX_LENGTH, verbose=0)
    assert not (tmp_path / "q").exists()


@pytest.mark.parametrize(
    "options,words",
    [({"attention": "standard"}, "attention='gqa'"), ({"formats": ("litert",)}, "litert files")],
)
def test_other_emitters_are_refused_for_a_gptq_model(tmp_path, options, words):
    model, blocks = _step_model()
    _calibrate([blocks[0].down], "awq", _config("awq", group_size=32))
    with pytest.raises(ExportError, match=words):
        save_decoder(model, tmp_path / "q", max_length=MAX_LENGTH, verbose=0, **options)
    assert not (tmp_path / "q").exists()


def test_keras_refuses_gptq_on_an_embedding_itself():
    # So no Embedding reaches the export as GPTQ / AWQ; `refuse_unexportable` names one
    # that would (gptq / awq are read in Dense and EinsumDense only).
    embedding = keras.layers.Embedding(10, 16)
    embedding.build((None,))
    with pytest.raises(Exception):  # noqa: B017 (Keras's own error, its type unpinned)
        embedding.quantize("gptq", config=_config("gptq"))
