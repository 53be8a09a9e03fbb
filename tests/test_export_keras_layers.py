"""Any Keras Transformer exports: the layers one is made of, in all three runtimes.

Dense, EinsumDense, LayerNormalization, RMSNormalization, MultiHeadAttention,
GroupQueryAttention, Embedding with `mask_zero`, Dropout and the common activations go
through the SavedModel, ONNX and LiteRT and verify against Keras; what a runtime cannot
run is refused with an error that names the op, the layer and a fix.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest

from keras_posenc import RotaryMultiHeadAttention
from keras_posenc import export as kpe

GRID = {"batch_sizes": (1, 2), "sequence_lengths": (3, 17), "max_sequence_length": 17}
ACTIVATIONS = [
    "relu", "silu", "tanh", "sigmoid", "softmax", "elu", "selu", "softplus", "leaky_relu",
    "relu6", "hard_sigmoid", "mish", "hard_silu", "log_softmax", "softsign", "glu",
    "sparse_plus", "squareplus", "tanh_shrink", "exponential", "linear",
]  # fmt: skip


def _transformer() -> keras.Model:
    token_ids = keras.Input((None,), dtype="int32", name="token_ids")
    x = keras.layers.Embedding(11, 8, mask_zero=True, name="embedding")(token_ids)
    x = x + keras.layers.MultiHeadAttention(2, 4, name="mha")(x, x)
    x = keras.layers.LayerNormalization(name="layer_norm")(x)
    x = keras.layers.EinsumDense("abc,cd->abd", (None, 8), bias_axes="d", name="einsum")(x)
    x = keras.layers.RMSNormalization(name="rms_norm")(x)
    x = x + keras.layers.GroupQueryAttention(4, 4, 2, name="gqa")(x, x)
    x = x + RotaryMultiHeadAttention(2, 4, name="rope_mha")(x, x)
    x = keras.layers.Dropout(0.5, name="dropout")(x)
    hidden = keras.layers.Dense(8, name="dense")(x)
    outputs = {"gelu_tanh": keras.ops.gelu(hidden, approximate=True)}
    for name in ACTIVATIONS:
        outputs[name] = keras.layers.Activation(name, name=name)(hidden)
    return keras.Model(token_ids, outputs, name="transformer")


@pytest.fixture(scope="module")
def transformer(tmp_path_factory):
    model = _transformer()
    folder = tmp_path_factory.mktemp("transformer")
    return (
        model,
        kpe.save_saved_model(model, folder / "saved_model"),
        kpe.save_onnx(model, folder / "model.onnx"),
        kpe.save_litert(model, folder / "model.tflite"),
    )


def test_a_keras_transformer_exports_and_verifies_in_every_runtime(transformer):
    model, saved, onnx_path, litert_path = transformer
    report = kpe.verify_export(model, saved, onnx_path, litert_path=litert_path, repeats=1, **GRID)
    assert report["passed"], report["summary"]  # allclose(atol=1e-5, rtol=1e-4) everywhere
    assert report["runtimes"] == ["keras", "saved_model", "onnxruntime", "litert"]


def test_celu_is_refused_by_onnx_with_the_layer_and_a_fix(tmp_path):
    x = keras.Input((None, 4), name="x")
    model = keras.Model(x, keras.layers.Activation("celu", name="my_celu")(x))
    with pytest.raises(kpe.ExportError, match=r"Expm1 in layer\(s\) my_celu .*'elu'"):
        kpe.save_onnx(model, tmp_path / "model.onnx")
    assert list(tmp_path.iterdir()) == []


def test_exact_gelu_exports_and_verifies(tmp_path):
    # The exact gelu leaves Erfc, which ONNX lacks: the export writes 1 - Erf.
    x = keras.Input((None, 4), name="x")
    model = keras.Model(x, keras.layers.Activation("gelu", name="exact_gelu")(x))
    path = kpe.save_onnx(model, tmp_path / "model.onnx")
    report = kpe.verify_export(model, None, path, repeats=1, **GRID)
    assert report["passed"], report["summary"]


def test_keras_causal_attention_is_refused_by_litert_with_the_fix(tmp_path):
    x = keras.Input((None, 8), name="x")
    attention = keras.layers.GroupQueryAttention(4, 4, 2, name="causal_gqa")
    model = keras.Model(x, attention(x, x, use_causal_mask=True))
    with pytest.raises(
        kpe.ExportError, match=r"StridedSlice, in layer\(s\) causal_gqa.*causal_mask"
    ):
        kpe.save_litert(model, tmp_path / "model.tflite")
    assert list(tmp_path.iterdir()) == []


def test_the_fix_the_error_names_is_the_causal_mask_and_converts(tmp_path):
    # The error names keras_posenc.export.causal_mask: it must exist there, be the lower
    # triangle (numpy's), and make the same attention convert with built-in ops.
    mask = np.asarray(kpe.causal_mask(np.zeros((2, 5, 3), np.float32)))
    np.testing.assert_array_equal(mask, np.tril(np.ones((5, 5), bool))[None])

    class CausalAttention(keras.layers.Layer):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.attention = keras.layers.GroupQueryAttention(4, 4, 2, name="gqa")

        def call(self, x):  # the mask of the call's length, made while it is traced
            return self.attention(x, x, attention_mask=kpe.causal_mask(x))

    x = keras.Input((None, 8), name="x")
    model = keras.Model(x, CausalAttention(name="causal_gqa")(x))
    path = kpe.save_litert(model, tmp_path / "model.tflite", max_sequence_length=17)
    report = kpe.verify_export(model, None, None, litert_path=path, repeats=1, **GRID)
    assert report["passed"], report["summary"]
