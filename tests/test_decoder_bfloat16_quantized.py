"""A bfloat16 model, quantized by Keras or at export, under `bfloat16="float32"` (issue 40).

A model Keras quantized keeps its integers: the file holds exactly the integers the
layers store and, as float32, the scales they store (read here from the Keras variables
and the file's initializers, unpacked with numpy alone, not with the export's readers).
Quantizing at export widens the bfloat16 weights to float32 (exact) and quantizes that
once: the file's bytes are onnxruntime's own quantizer's of the widened kernels.
`bfloat16="error"` refuses either model, naming the dtype.
"""

from __future__ import annotations

import keras
import numpy as np
import onnx
import pytest
from onnx import numpy_helper
from onnxruntime.capi._pybind_state import quantize_matmul_4bits
from test_decoder_save import WIDTH, step_model

from keras_posenc.backend import keras_private
from keras_posenc.export import save_decoder
from keras_posenc.export.errors import ExportError

MAX_LENGTH = 24


def _built_under(policy: str):
    keras.utils.set_random_seed(0)
    keras.config.set_dtype_policy(policy)
    try:
        return step_model()
    finally:
        keras.config.set_dtype_policy("float32")


def _signed_nibbles(packed: np.ndarray) -> np.ndarray:
    """int8 bytes -> their two 4-bit two's-complement integers, the low nibble first."""
    u = packed.astype(np.uint8)
    both = np.stack([u & 15, u >> 4], axis=-1).reshape(*u.shape[:-1], -1).astype(np.int8)
    return np.where(both > 7, both - 16, both).astype(np.int8)


def _values(layer, suffix: str):
    found = [v for v in layer.weights if v.path.endswith(suffix)]
    if not found:
        return None
    return keras.ops.convert_to_numpy(keras.ops.cast(found[0], "float32")), found[0]


def _keras_stored(model) -> list[tuple[str, np.ndarray, np.ndarray, np.ndarray | None]]:
    """`(path, q (K, N), scales (blocks, N) float32, zeros (blocks, N) or None)` of each
    layer Keras quantized, `w[k, n] = (q - zero) * scale` (int4) or `q / scale` (int8),
    with the embedding as the head's layout (K the width)."""
    stored = []
    for layer in keras_private.all_layers(model):
        mode = getattr(layer.dtype_policy, "quantization_mode", None)
        if mode is None:
            continue
        table = isinstance(layer, keras.layers.Embedding)
        name = "embeddings" if table else "kernel"
        integers = _values(layer, f"/{name}")[1]
        assert keras.backend.standardize_dtype(integers.dtype) == "int8"
        integers = keras.ops.convert_to_numpy(integers)
        scales = _values(layer, f"/{name}_scale")[0]
        zeros = _values(layer, f"/{name}_zero")
        if mode == "int8":  # per output channel: q (..., N) and scale (..., N)
            n = scales.size
            q = integers.T if table else integers.reshape(-1, n)
            stored.append((layer.path, q, scales.reshape(1, n), None))
        else:  # int4: packed along the output axis, scale and zero per block
            q = _signed_nibbles(integers)
            zeros = zeros[0].astype(np.int8)
            if table:  # (V, D): blocks along D, the head's N is V
                q, scales, zeros = q.T, scales.T, zeros.T
            q = q[:, : scales.shape[1]]
            stored.append((layer.path, q, scales, zeros))
    return stored


def _file_stored(path) -> list[tuple[str, np.ndarray, np.ndarray, np.ndarray | None]]:
    """The file's `(name, q (K, N), scales (blocks, N), zeros or None)`, as `_keras_stored`:
    int8 `weight_int8` / `weight_scale`; int4 MatMulNBits' `weight_Q4` (N, blocks, bytes),
    `weight_scales` and `weight_zp`, both stored as unsigned (`q + 8`, `zero + 8`)."""
    arrays = {t.name: numpy_helper.to_array(t) for t in onnx.load(path).graph.initializer}
    stored = []
    for name, q in arrays.items():
        base = name.rsplit(".weight_", 1)[0]
        if name.endswith(".weight_int8"):
            scales = arrays[f"{base}.weight_scale"]
            stored.append((base, q, scales.reshape(1, -1), None))
        elif name.endswith(".weight_Q4"):
            n, blocks, _ = q.shape
            unsigned = np.stack([q & 15, q >> 4], axis=-1).reshape(n, -1).astype(np.int16)
            zp = arrays[f"{base}.weight_zp"]
            zeros = np.stack([zp & 15, zp >> 4], axis=-1).reshape(n, -1)[:, :blocks]
            scales = arrays[f"{base}.weight_scales"].T
            stored.append((base, (unsigned - 8).T, scales, (zeros.astype(np.int16) - 8).T))
    return stored


def _assert_stored_as_is(model, path) -> None:
    """Every Keras-quantized layer's integers, zeros and float32 scales are columns of one
    of the file's integer initializers, and every column of the file's is one layer's."""
    written = _file_stored(path)
    claimed = {name: 0 for name, *_ in written}
    for layer, q, scales, zeros in _keras_stored(model):
        k, n = q.shape
        found = False
        for name, fq, fscales, fzeros in written:
            for o in range(fq.shape[1] - n + 1 if fq.shape[0] >= k else 0):
                if (
                    np.array_equal(fq[:k, o : o + n], q)
                    and np.array_equal(fscales[:, o : o + n], scales)
                    and (zeros is None or np.array_equal(fzeros[:, o : o + n], zeros))
                ):
                    claimed[name] += n
                    found = True
                    break
            if found:
                break
        assert found, f"{layer}'s stored integers and scales are not in the file"
    for name, fq, *_ in written:
        assert claimed[name] == fq.shape[1], name


@pytest.mark.parametrize("mode,policy", [("int8", "bfloat16"), ("int4", "mixed_bfloat16")])
def test_a_keras_quantized_bfloat16_model_is_written_with_its_integers(tmp_path, mode, policy):
    model = _built_under(policy)
    model.quantize(mode)
    with pytest.raises(ExportError, match="bfloat16"):
        save_decoder(model, tmp_path / "e", max_length=MAX_LENGTH, verbose=0, bfloat16="error")
    assert not (tmp_path / "e").exists()
    with pytest.warns(UserWarning, match="float32 copy"):
        report = save_decoder(model, tmp_path / "q", max_length=MAX_LENGTH, verbose=0)
    assert report["passed"] and report["quantization"]["keras"] == mode
    _assert_stored_as_is(model, tmp_path / "q" / "model.onnx")


def test_quantizing_a_bfloat16_model_at_export_quantizes_its_float32_widening(tmp_path):
    model = _built_under("bfloat16")
    with pytest.raises(ExportError, match="bfloat16"):
        save_decoder(model, tmp_path / "e", max_length=MAX_LENGTH, verbose=0, bfloat16="error")
    block = 32
    report = save_decoder(
        model, tmp_path / "q", max_length=MAX_LENGTH, verbose=0, quantize="int4", block_size=block
    )
    assert report["passed"]
    arrays = {
        t.name: numpy_helper.to_array(t)
        for t in onnx.load(tmp_path / "q" / "model.onnx").graph.initializer
    }
    packed = [(arrays[n], arrays[n.replace("_Q4", "_scales")]) for n in arrays if "_Q4" in n]
    kernels = [
        keras.ops.convert_to_numpy(keras.ops.cast(v, "float32"))  # exact: bfloat16 in float32
        for v in model.weights
        if v.path.endswith("/kernel")
    ]
    columns = 0
    for kernel in kernels:
        # EinsumDense: q/k/v (width, heads, head), the output (heads, head, width)
        inputs_first = kernel.shape[0] == WIDTH
        kernel = kernel.reshape((WIDTH, -1) if inputs_first else (-1, kernel.shape[-1]))
        k, n = kernel.shape
        expected = np.zeros((n, k // block, block // 2), np.uint8)
        scales = np.zeros((n, k // block), np.float32)
        zero = np.zeros((n, (k // block + 1) // 2), np.uint8)
        quantize_matmul_4bits(expected, kernel, scales, zero, block, n, k, True)
        assert any(
            any(
                np.array_equal(got[o : o + n], expected)
                and np.array_equal(got_scales[o : o + n], scales)
                for o in range(got.shape[0] - n + 1)
            )
            for got, got_scales in packed
        ), kernel.shape
        columns += n
    assert columns == sum(got.shape[0] for got, _ in packed)
    table = next(v for v in model.weights if v.path.endswith("/embeddings"))
    widened = keras.ops.convert_to_numpy(keras.ops.cast(table, "float32"))
    assert np.array_equal(arrays["embed_tokens"], widened)  # an untied table: float32


@pytest.mark.parametrize("bits", [4, 8])
def test_a_block_whose_largest_magnitude_is_tied_quantizes_as_onnxruntime_does(bits):
    """bfloat16 weights (8-bit significands) often hold `m` and `-m` in one block: MLAS
    then takes `-m` as the block's largest value (a positive scale)."""
    from onnxruntime.capi._pybind_state import quantize_matmul_8bits

    from keras_posenc.export.decoder.quantize import quantize

    k, n, block = 64, 4, 32
    kernel = np.random.default_rng(bits).uniform(-0.1, 0.1, (k, n)).astype(np.float32)
    kernel[[0, 5], 0] = [0.1875, -0.1875]  # + first
    kernel[[3, 9], 1] = [-0.1875, 0.1875]  # - first
    kernel[[32, 40], 2] = [0.25, -0.25]
    expected = np.zeros((n, k // block, block * bits // 8), np.uint8)
    scales = np.zeros((n, k // block), np.float32)
    zero = np.zeros((n, (k // block + 1) // 2), np.uint8)
    runner = quantize_matmul_4bits if bits == 4 else quantize_matmul_8bits
    runner(expected, kernel, scales, zero, block, n, k, True)
    stored = quantize(kernel, bits, block)
    np.testing.assert_array_equal(stored.scales, scales)
    np.testing.assert_array_equal(stored.packed, expected)
