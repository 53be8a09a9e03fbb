"""`save_decoder(quantize="int4", quantize_embedding=True)`: an untied embedding as int4.

The genai builder's `--extra_options op_types_to_quantize=MatMul/Gather` writes an untied
table as `GatherBlockQuantized` over an `INT4` tensor: the table's bytes and scales are
checked against onnxruntime's own quantizer (`DefaultWeightOnlyQuantizer.quantize_ndarray`,
what the builder calls), ties included; a step model exports with it verified (the
reference reads the same table dequantized) and a file with a wrong table scale fails.
"""

from __future__ import annotations

import keras
import numpy as np
import onnx
import pytest
from keras_hub_models import GENAI
from onnx import TensorProto, numpy_helper
from test_decoder_save import step_model

from keras_posenc.export import save_decoder
from keras_posenc.export.decoder import save
from keras_posenc.export.decoder.keras_reader import describe_decoder
from keras_posenc.export.decoder.progress import Progress
from keras_posenc.export.decoder.quantized_embedding import gather_quantize, int4_bytes
from keras_posenc.export.decoder.quantized_graph import Quantization
from keras_posenc.export.decoder.quantized_save import verify_quantized_decoder
from keras_posenc.export.errors import ExportError

# onnxruntime's quantizer imports onnx-ir, which the `genai` extra installs (`test` has it).
DefaultWeightOnlyQuantizer = pytest.importorskip(
    "onnxruntime.quantization.matmul_nbits_quantizer",
    reason="onnxruntime's weight-only quantizer needs onnx-ir (pip install -e '.[test]')",
).DefaultWeightOnlyQuantizer

MAX_LENGTH = 24
BLOCK = 32


def _onnxruntimes(table: np.ndarray, block: int):
    """The builder's `(INT4 bytes, scales)` of `table`."""
    data, scales, _ = DefaultWeightOnlyQuantizer.quantize_ndarray(table, 1, block, True)
    return data, scales


def test_the_table_is_quantized_as_onnxruntimes_quantizer_does():
    table = np.random.default_rng(0).standard_normal((10, 64)).astype(np.float32)
    table[0, [1, 7]] = [0.75, -0.75]  # a block's largest magnitude tied
    table[1, :32] = np.arange(-16, 16) / 16 * 0.75  # exact half steps: half to even
    table[2, 32:] = 0  # an all-zero block
    q, scales = gather_quantize(table, BLOCK)
    data, expected_scales = _onnxruntimes(table, BLOCK)
    np.testing.assert_array_equal(int4_bytes(q), data)
    np.testing.assert_array_equal(scales, expected_scales)


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    keras.utils.set_random_seed(0)
    model = step_model()
    folder = tmp_path_factory.mktemp("embedding") / "q"
    report = save_decoder(
        model, folder, max_length=MAX_LENGTH, verbose=0, quantize="int4", quantize_embedding=True
    )
    return model, folder, report


def test_an_untied_step_model_exports_with_its_embedding_quantized_and_verified(written):
    model, folder, report = written
    assert report["passed"] and set(report["cases"][0]["runtimes"]) >= {"onnxruntime", *GENAI}
    graph = onnx.load(folder / "model.onnx").graph
    gather = next(n for n in graph.node if n.op_type == "GatherBlockQuantized")
    tensors = {t.name: t for t in graph.initializer}
    data, scales = tensors[gather.input[0]], tensors[gather.input[2]]
    assert data.data_type == TensorProto.INT4 and not any(n.op_type == "Gather" for n in graph.node)
    table = keras.ops.convert_to_numpy(next(v for v in model.weights if "embeddings" in v.path))
    expected_data, expected_scales = _onnxruntimes(table, BLOCK)
    assert data.raw_data == expected_data.tobytes()
    np.testing.assert_array_equal(numpy_helper.to_array(scales), expected_scales)


def test_a_wrong_table_scale_fails_the_verification(written):
    model, folder, _ = written
    written_model = onnx.load(folder / "model.onnx")
    scales = next(
        t for t in written_model.graph.initializer if t.name == "embed_tokens.weight_scales"
    )
    array = numpy_helper.to_array(scales).copy()
    array[:, 0] *= 1.5  # every token's first block
    scales.CopyFrom(numpy_helper.from_array(array, scales.name))
    onnx.save(written_model, folder / "model.onnx")
    quantization = Quantization(4, BLOCK, 4, embedding=True)
    runtimes = save._runtimes(folder, ("onnx",), MAX_LENGTH, quantization)
    decoder = describe_decoder(model, MAX_LENGTH)
    report = verify_quantized_decoder(
        model, decoder, False, runtimes, MAX_LENGTH, quantization, Progress(0, folder)
    )
    assert not report["passed"]


@pytest.mark.parametrize(
    "options,error,words",
    [
        ({}, ExportError, "needs quantize='int4'"),
        ({"quantize": "int8"}, ExportError, "needs quantize='int4'"),
        ({"quantize": "int4", "attention": "standard"}, ExportError, "attention='gqa' only"),
        ({"quantize": "int4", "symmetric": False}, ExportError, "symmetric only"),
        ({"quantize": "int4", "formats": ("litert",)}, ExportError, "needs quantize='int4'"),
    ],
)
def test_what_cannot_be_written_is_refused_before_anything_is_written(
    tmp_path, options, error, words
):
    with pytest.raises(error, match=words):
        save_decoder(
            step_model(), tmp_path / "q", max_length=MAX_LENGTH, quantize_embedding=True, **options
        )
    assert not (tmp_path / "q").exists()
