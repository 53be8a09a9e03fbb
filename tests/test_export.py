"""SavedModel and ONNX export (`keras_posenc.export`): round trips, checks, and bad input.

References are independent of the code under test: the layers' formulas in numpy float64,
the Keras model itself, sizes computed here from the models' shapes. Exports are costly
(a tf2onnx conversion takes seconds), so each model is exported once per module and the
verification grids are small; `python -m export` runs the full grid.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import keras
import numpy as np
import onnx
import pytest
import tensorflow as tf
from float32_error import assert_within_bound, position_sum_error, rotation_error
from onnx import numpy_helper

from keras_posenc import (
    LearnedPositionalEmbedding,
    RotaryEmbedding,
    RotaryMultiHeadAttention,
    SinusoidalPositionalEncoding,
)
from keras_posenc import export as kpe

REPOSITORY = Path(__file__).resolve().parents[1]
if str(REPOSITORY) not in sys.path:  # `export` is a top-level folder of the repository
    sys.path.insert(0, str(REPOSITORY))

from keras_posenc.export.verify.runtimes import onnx_session  # noqa: E402
from keras_posenc_cli.encoders import DEFAULT_ENCODERS, build_encoder  # noqa: E402

SMALL_GRID = {"batch_sizes": (1, 3), "sequence_lengths": (2, 17), "repeats": 1}
# For unbounded models: the cases that reach every cached row (4096 steps and more) are
# tested on tiny models in test_export_coverage.py.
CAPPED_GRID = {**SMALL_GRID, "max_sequence_length": 64}
CACHED_POSITIONS = 4096  # rows of a layer's cached table; the split tables have as many


# --------------------------------------------------------------------------------------
# Independent references (numpy float64)


def frequencies(width: int, base: float = 10000.0) -> np.ndarray:
    return base ** (-np.arange(0, width, 2, dtype=np.float64) / width)


def sinusoidal_reference(x: np.ndarray, start: int) -> np.ndarray:
    """x + P with P[i, 2k] = sin(iω_k), P[i, 2k+1] = cos(iω_k) (Vaswani et al.)."""
    positions = np.arange(start, start + x.shape[1], dtype=np.float64)
    angles = np.outer(positions, frequencies(x.shape[-1]))
    table = np.empty((x.shape[1], x.shape[-1]))
    table[:, 0::2] = np.sin(angles)
    table[:, 1::2] = np.cos(angles)
    return x.astype(np.float64) + table


def rotary_reference(x: np.ndarray, start: int) -> np.ndarray:
    """Half-split RoPE: y = x·cos + rotate_half(x)·sin, rotate_half([a, b]) = [-b, a]."""
    width = x.shape[-1]
    positions = np.arange(start, start + x.shape[1], dtype=np.float64)
    angles = np.outer(positions, frequencies(width))  # (sequence, width / 2)
    cos = np.concatenate([np.cos(angles)] * 2, -1)[None, :, None, :]
    sin = np.concatenate([np.sin(angles)] * 2, -1)[None, :, None, :]
    x = x.astype(np.float64)
    half = width // 2
    rotated = np.concatenate([-x[..., half:], x[..., :half]], -1)
    return x * cos + rotated * sin


# --------------------------------------------------------------------------------------
# Exported models, once per module


def export_all(model: keras.Model, folder: Path) -> tuple[Path, Path]:
    folder.mkdir(parents=True, exist_ok=True)
    saved_model = kpe.save_saved_model(model, folder / "saved_model")
    onnx_path = kpe.save_onnx(model, folder / "model.onnx")
    return saved_model, onnx_path


@pytest.fixture(scope="module")
def sinusoidal_encoder(tmp_path_factory):
    model = build_encoder(DEFAULT_ENCODERS["sinusoidal"])
    return model, *export_all(model, tmp_path_factory.mktemp("sinusoidal"))


@pytest.fixture(scope="module")
def learned_encoder(tmp_path_factory):
    model = build_encoder(DEFAULT_ENCODERS["learned"])
    return model, *export_all(model, tmp_path_factory.mktemp("learned"))


@pytest.fixture(scope="module")
def rotary_decoder(tmp_path_factory):
    """The rotary encoder with a `start_index` input (decoding) and causal attention."""
    model = build_encoder(DEFAULT_ENCODERS["rotary"], decoding=True)
    return model, *export_all(model, tmp_path_factory.mktemp("rotary_decoder"))


LEARNED_LENGTH = 8192  # past the 4096 cached rows of the other two layers


@pytest.fixture(scope="module")
def position_layers(tmp_path_factory):
    """The three layers, each alone on its output: float inputs and a start index."""
    embeddings = keras.Input((None, 8), name="embeddings")
    heads = keras.Input((None, 2, 8), name="heads")
    start = keras.Input(batch_shape=(), dtype="int32", name="start_index")
    encoded = SinusoidalPositionalEncoding()(embeddings, start_index=start)
    learned = LearnedPositionalEmbedding(LEARNED_LENGTH)(embeddings, start_index=start)
    rotated = RotaryEmbedding()(heads, start_index=start)
    model = keras.Model(
        {"embeddings": embeddings, "heads": heads, "start_index": start},
        {"encoded": encoded, "learned": learned, "rotated": rotated},
    )
    return model, *export_all(model, tmp_path_factory.mktemp("position_layers"))


# --------------------------------------------------------------------------------------
# Each layer alone


@pytest.mark.parametrize("start", [0, 3, 5000])  # 5000: past the cached rows
@pytest.mark.parametrize("sequence", [1, 17])
def test_position_layers_in_onnxruntime_match_the_formulas(position_layers, start, sequence):
    model, _, onnx_path = position_layers
    (table,) = model.get_weights()
    rng = np.random.default_rng(sequence)
    feeds = {
        "embeddings": rng.standard_normal((3, sequence, 8)).astype(np.float32),
        "heads": rng.standard_normal((3, sequence, 2, 8)).astype(np.float32),
        "start_index": np.array(start, np.int32),
    }
    session = onnx_session(onnx_path)
    names = [o.name for o in session.get_outputs()]
    outputs = dict(zip(names, session.run(None, feeds), strict=True))
    embeddings, heads = feeds["embeddings"], feeds["heads"]
    assert_within_bound(
        outputs["encoded"], sinusoidal_reference(embeddings, start), position_sum_error(embeddings)
    )
    assert_within_bound(outputs["rotated"], rotary_reference(heads, start), rotation_error(heads))
    rows = table[start : start + sequence]  # float32 rows: the sum's rounding alone
    assert_within_bound(
        outputs["learned"],
        embeddings.astype(np.float64) + rows,
        position_sum_error(embeddings, 0.0, np.abs(rows)),
    )


def test_position_layers_in_the_saved_model_match_the_formulas(position_layers):
    _, saved_model, _ = position_layers
    serve = tf.saved_model.load(str(saved_model)).signatures["serving_default"]
    embeddings = np.random.default_rng(0).standard_normal((2, 5, 8)).astype(np.float32)
    heads = np.random.default_rng(1).standard_normal((2, 5, 2, 8)).astype(np.float32)
    outputs = serve(
        embeddings=tf.constant(embeddings),
        heads=tf.constant(heads),
        start_index=tf.constant(7),
    )
    bound = position_sum_error(embeddings)
    assert_within_bound(outputs["encoded"], sinusoidal_reference(embeddings, 7), bound)
    assert_within_bound(outputs["rotated"], rotary_reference(heads, 7), rotation_error(heads))


def test_multiple_inputs_and_named_outputs_keep_their_names(position_layers):
    _, _, onnx_path = position_layers
    graph = onnx.load(str(onnx_path)).graph
    assert [i.name for i in graph.input] == ["embeddings", "heads", "start_index"]
    assert sorted(o.name for o in graph.output) == ["encoded", "learned", "rotated"]
    start_index = next(i for i in graph.input if i.name == "start_index")
    assert len(start_index.type.tensor_type.shape.dim) == 0  # a scalar


def test_verify_passes_for_the_position_layers(position_layers):
    model, saved_model, onnx_path = position_layers
    report = kpe.verify_export(model, saved_model, onnx_path, **SMALL_GRID)
    assert report["passed"]
    assert report["longest_sequence"] == LEARNED_LENGTH  # the learned table's length
    assert {case["sequence"] for case in report["cases"]} == {2, 17, LEARNED_LENGTH}
    assert report["summary"]["onnxruntime"]["max_abs_error"] <= 1e-5


def test_learned_layer_alone_round_trips(tmp_path):
    inputs = keras.Input((None, 8), name="embeddings")
    model = keras.Model(inputs, LearnedPositionalEmbedding(40)(inputs))
    saved_model, onnx_path = export_all(model, tmp_path)
    (table,) = model.get_weights()
    x = np.random.default_rng(0).standard_normal((2, 40, 8)).astype(np.float32)
    (onnx_output,) = onnx_session(onnx_path).run(None, {"embeddings": x})
    bound = position_sum_error(x, 0.0, np.abs(table))  # float32 rows: the sum's rounding
    assert_within_bound(onnx_output, x.astype(np.float64) + table, bound)

    report = kpe.verify_export(model, saved_model, onnx_path, **SMALL_GRID)
    assert report["longest_sequence"] == 40  # the table's length is verified too
    assert {case["sequence"] for case in report["cases"]} == {2, 17, 40}
    assert report["passed"]


def test_rotary_attention_alone_round_trips(tmp_path):
    inputs = keras.Input((None, 16), name="states")
    model = keras.Model(inputs, RotaryMultiHeadAttention(num_heads=2, key_dim=8)(inputs, inputs))
    saved_model, onnx_path = export_all(model, tmp_path)
    report = kpe.verify_export(model, saved_model, onnx_path, **CAPPED_GRID)
    assert report["passed"]
    assert report["summary"]["saved_model"]["max_abs_error"] <= 1e-6
    assert report["summary"]["onnxruntime"]["max_abs_error"] <= 1e-5


# --------------------------------------------------------------------------------------
# Inside an encoder


@pytest.mark.parametrize("fixture", ["sinusoidal_encoder", "learned_encoder", "rotary_decoder"])
def test_encoders_verify(fixture, request):
    model, saved_model, onnx_path = request.getfixturevalue(fixture)
    report = kpe.verify_export(model, saved_model, onnx_path, **CAPPED_GRID)
    assert report["passed"], report["summary"]
    assert report["summary"]["saved_model"]["max_abs_error"] <= 1e-6
    assert report["summary"]["onnxruntime"]["max_abs_error"] <= 1e-5


def test_rotary_decoder_past_the_cached_positions(rotary_decoder):
    model, saved_model, onnx_path = rotary_decoder

    def make_inputs(batch, sequence):
        token_ids = np.random.default_rng(sequence).integers(0, 1000, (batch, sequence))
        return {
            "token_ids": token_ids.astype(np.int32),
            "start_index": np.array(CACHED_POSITIONS + 904, np.int32),
        }

    report = kpe.verify_export(model, saved_model, onnx_path, make_inputs=make_inputs, **SMALL_GRID)
    assert report["passed"], report["summary"]


def test_onnx_axes_are_named_batch_and_sequence(sinusoidal_encoder):
    _, _, onnx_path = sinusoidal_encoder
    graph = onnx.load(str(onnx_path)).graph
    assert [i.name for i in graph.input] == ["token_ids"]
    for value in (graph.input[0], graph.output[0]):
        dims = value.type.tensor_type.shape.dim
        assert [dims[0].dim_param, dims[1].dim_param] == ["batch", "sequence"]
    assert graph.output[0].type.tensor_type.shape.dim[2].dim_value == 64


def test_onnx_passes_the_full_checker(rotary_decoder):
    _, _, onnx_path = rotary_decoder
    onnx.checker.check_model(onnx.load(str(onnx_path)), full_check=True)


def _constant_bytes(graph) -> int:
    """Initializers and Constant nodes of a graph and all its subgraphs."""
    total = sum(numpy_helper.to_array(i).nbytes for i in graph.initializer)
    for node in graph.node:
        for attribute in node.attribute:
            if attribute.type == onnx.AttributeProto.TENSOR:
                total += numpy_helper.to_array(attribute.t).nbytes
            for subgraph in [attribute.g] if attribute.HasField("g") else attribute.graphs:
                total += _constant_bytes(subgraph)
    return total


@pytest.mark.parametrize(
    "fixture, table_bytes",
    [
        # cached rows (4096 x 64) and the four split tables (4096 x 32): float32
        ("sinusoidal_encoder", 4 * CACHED_POSITIONS * (64 + 4 * 32)),
        ("learned_encoder", 0),  # its table is a weight
        # per head of 16 channels: cos and sin rows (4096 x 16 each), split tables (4096 x 8)
        ("rotary_decoder", 4 * CACHED_POSITIONS * (2 * 16 + 4 * 8)),
    ],
)
def test_onnx_holds_each_weight_once(fixture, table_bytes, request):
    model, _, onnx_path = request.getfixturevalue(fixture)
    parameter_bytes = 4 * model.count_params()
    constant_bytes = _constant_bytes(onnx.load(str(onnx_path)).graph)
    assert parameter_bytes + table_bytes <= constant_bytes <= 1.1 * parameter_bytes + table_bytes


# --------------------------------------------------------------------------------------
# The SavedModel in a process without keras_posenc

_LOAD_WITHOUT_KERAS_POSENC = """
import sys
sys.modules["keras_posenc"] = None  # importing it now fails
import numpy as np
import tensorflow as tf

serve = tf.saved_model.load(sys.argv[1]).signatures["serving_default"]
(_, specs) = serve.structured_input_signature
assert specs["token_ids"].shape.as_list() == [None, None], specs
token_ids = np.load(sys.argv[2])
np.save(sys.argv[3], serve(token_ids=tf.constant(token_ids))["encoded"].numpy())
"""


def test_saved_model_loads_in_a_fresh_process_without_keras_posenc(sinusoidal_encoder, tmp_path):
    _, saved_model, _ = sinusoidal_encoder
    token_ids = np.random.default_rng(0).integers(0, 1000, (3, 29)).astype(np.int32)
    np.save(tmp_path / "token_ids.npy", token_ids)
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            _LOAD_WITHOUT_KERAS_POSENC,
            str(saved_model),
            str(tmp_path / "token_ids.npy"),
            str(tmp_path / "encoded.npy"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    # The same graph and kernels as the SavedModel served here: the same float32 numbers,
    # exactly (its agreement with Keras is the verifier's, `test_encoders_verify`).
    serve = tf.saved_model.load(str(saved_model)).signatures["serving_default"]
    expected = serve(token_ids=tf.constant(token_ids))["encoded"].numpy()
    np.testing.assert_array_equal(np.load(tmp_path / "encoded.npy"), expected)


# --------------------------------------------------------------------------------------
# The verifier can fail


def test_verifier_fails_on_a_perturbed_onnx_file(sinusoidal_encoder, tmp_path):
    model, saved_model, onnx_path = sinusoidal_encoder
    proto = onnx.load(str(onnx_path))
    (embedding,) = [i for i in proto.graph.initializer if tuple(i.dims) == (1000, 64)]
    values = numpy_helper.to_array(embedding)
    noise = np.random.default_rng(0).normal(0.0, 1e-3, values.shape).astype(np.float32)
    embedding.CopyFrom(numpy_helper.from_array(values + noise, embedding.name))
    perturbed = tmp_path / "perturbed.onnx"
    onnx.save(proto, str(perturbed))
    report_path = tmp_path / "report.json"

    with pytest.raises(kpe.VerificationError, match="differs from Keras") as failure:
        kpe.verify_export(model, saved_model, perturbed, report_path=report_path, **CAPPED_GRID)

    report = json.loads(report_path.read_text())
    assert report == json.loads(json.dumps(failure.value.report))
    assert report["passed"] is False
    assert report["summary"]["onnxruntime"]["passed"] is False
    assert report["summary"]["onnxruntime"]["max_abs_error"] > 1e-4
    assert report["summary"]["saved_model"]["passed"] is True
    assert perturbed.is_file() and (saved_model / "saved_model.pb").is_file()


def test_compare_outputs_fails_on_shape_and_nan():
    expected = {"y": np.zeros((2, 3))}
    tolerance = kpe.FLOAT32_TOLERANCE
    assert kpe.compare_outputs({"y": np.zeros((2, 3))}, expected, tolerance)["passed"]
    assert not kpe.compare_outputs({"y": np.zeros((2, 4))}, expected, tolerance)["passed"]
    assert not kpe.compare_outputs({"y": np.full((2, 3), np.nan)}, expected, tolerance)["passed"]
    assert not kpe.compare_outputs({}, expected, tolerance)["passed"]
    # allclose's bound |a - b| <= atol + rtol |b|: just inside and just outside
    reference = {"y": np.array([1.0])}
    inside = kpe.compare_outputs({"y": np.array([1.0 + 1.09e-4])}, reference, tolerance)
    outside = kpe.compare_outputs({"y": np.array([1.0 + 1.11e-4])}, reference, tolerance)
    assert inside["passed"] and not outside["passed"]
    assert inside["max_abs_error"] == pytest.approx(1.09e-4)
    assert inside["max_rel_error"] == pytest.approx(1.09e-4)


# --------------------------------------------------------------------------------------
# Precision


def _small_model(dtype: str) -> keras.Model:
    inputs = keras.Input((None, 8), name="embeddings")
    encoded = SinusoidalPositionalEncoding(dtype=dtype)(inputs)
    outputs = keras.layers.Dense(
        8, dtype=dtype, kernel_initializer=keras.initializers.GlorotUniform(seed=1)
    )(encoded)
    return keras.Model(inputs, {"projected": outputs})


def test_float16_model_is_compared_with_its_float32_twin(tmp_path):
    model = _small_model("float16")
    saved_model, onnx_path = export_all(model, tmp_path)
    report = kpe.verify_export(model, saved_model, onnx_path, **CAPPED_GRID)
    assert report["reference"] == "keras float32 twin"
    assert report["tolerance"] == {"atol": 1e-2, "rtol": 1e-2}
    assert report["passed"]
    assert 0 < report["summary"]["onnxruntime"]["max_abs_error"] <= 1e-2

    # independently: the float16 ONNX output against the formula in float64
    x = np.random.default_rng(0).standard_normal((2, 30, 8)).astype(np.float32)
    (output,) = onnx_session(onnx_path).run(None, {"embeddings": x})
    kernel, bias = (w.astype(np.float64) for w in model.get_weights())
    np.testing.assert_allclose(output, sinusoidal_reference(x, 0) @ kernel + bias, atol=2e-2)


@pytest.mark.parametrize("dtype", ["bfloat16", "mixed_bfloat16"])
def test_bfloat16_model_exports_a_float32_copy_that_loads(dtype, tmp_path):
    model = _small_model(dtype)
    with pytest.warns(UserWarning, match="float32 copy"):
        onnx_path = kpe.save_onnx(model, tmp_path / "model.onnx")
    session = onnx_session(onnx_path)
    assert session.get_inputs()[0].type == "tensor(float)"
    assert session.get_outputs()[0].type == "tensor(float)"
    x = np.random.default_rng(0).standard_normal((2, 5, 8)).astype(np.float32)
    (output,) = session.run(None, {"embeddings": x})
    kernel, bias = (w.astype(np.float64) for w in model.get_weights())
    np.testing.assert_allclose(output, sinusoidal_reference(x, 0) @ kernel + bias, atol=1e-5)


def test_bfloat16_model_can_be_refused(tmp_path):
    with pytest.raises(kpe.ExportError, match="float32"):
        kpe.save_onnx(_small_model("mixed_bfloat16"), tmp_path / "model.onnx", bfloat16="error")
    assert list(tmp_path.iterdir()) == []


# --------------------------------------------------------------------------------------
# Bad input: a clear error and no partial files


@pytest.fixture(scope="module")
def tiny_model():
    inputs = keras.Input((None, 4), name="embeddings")
    return keras.Model(inputs, SinusoidalPositionalEncoding()(inputs))


def test_missing_artifacts_to_verify(sinusoidal_encoder, tmp_path):
    model, saved_model, onnx_path = sinusoidal_encoder
    with pytest.raises(FileNotFoundError, match="No SavedModel"):
        kpe.verify_export(model, tmp_path / "nothing", onnx_path)
    with pytest.raises(FileNotFoundError, match="No ONNX file"):
        kpe.verify_export(model, saved_model, tmp_path / "nothing.onnx")


def test_unwritable_folder(tiny_model, tmp_path):
    # /sys refuses new files even to root; a file cannot hold files.
    with pytest.raises(OSError, match="Cannot write into '/sys'"):
        kpe.save_onnx(tiny_model, "/sys/keras_posenc_model.onnx")
    assert not Path("/sys/keras_posenc_model.onnx").exists()
    with pytest.raises(OSError, match="Cannot write into '/sys'"):
        kpe.save_saved_model(tiny_model, "/sys/keras_posenc_saved_model")
    assert not Path("/sys/keras_posenc_saved_model").exists()

    (tmp_path / "a_file").write_text("")
    with pytest.raises(NotADirectoryError, match="is a file"):
        kpe.save_onnx(tiny_model, tmp_path / "a_file" / "model.onnx")
    assert [p.name for p in tmp_path.iterdir()] == ["a_file"]


def test_model_with_no_inputs(tmp_path):
    class Subclassed(keras.Model):
        def call(self, x):
            return x

    model = Subclassed()
    model(np.zeros((1, 2, 4), np.float32))
    for save in (kpe.save_onnx, kpe.save_saved_model):
        with pytest.raises(kpe.ExportError, match="has no inputs.*keras.Input"):
            save(model, tmp_path / "out")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("opset", [12, 19, 22])
def test_unsupported_opset(tiny_model, tmp_path, opset):
    with pytest.raises(ValueError, match=f"opset {opset} is not supported.*opset=17"):
        kpe.save_onnx(tiny_model, tmp_path / "model.onnx", opset=opset)
    assert list(tmp_path.iterdir()) == []


def test_unconvertible_op_leaves_no_file(tmp_path):
    inputs = keras.Input((None, 4), name="embeddings")
    model = keras.Model(inputs, keras.layers.Activation("celu")(inputs))  # Expm1: no ONNX op
    with pytest.raises(kpe.ExportError, match="Expm1"):
        kpe.save_onnx(model, tmp_path / "model.onnx")
    assert list(tmp_path.iterdir()) == []


def test_captured_constant_is_refused(tmp_path):
    class CapturesAConstant(keras.layers.Layer):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.offset = tf.constant(np.arange(4, dtype=np.float32))  # eager: captured

        def call(self, x):
            return x + self.offset

    inputs = keras.Input((None, 4), name="embeddings")
    model = keras.Model(inputs, CapturesAConstant()(inputs))
    with pytest.raises(kpe.ExportError, match="inputs .* are not the signature's"):
        kpe.save_onnx(model, tmp_path / "model.onnx")
    assert list(tmp_path.iterdir()) == []


def test_existing_saved_model_is_replaced_and_other_folders_are_not(tiny_model, tmp_path):
    target = tmp_path / "saved_model"
    kpe.save_saved_model(tiny_model, target)
    first = (target / "saved_model.pb").stat().st_mtime_ns
    kpe.save_saved_model(tiny_model, target)
    assert (target / "saved_model.pb").stat().st_mtime_ns >= first
    assert sorted(p.name for p in tmp_path.iterdir()) == ["saved_model"]

    other = tmp_path / "notes"
    other.mkdir()
    (other / "keep.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="other contents"):
        kpe.save_saved_model(tiny_model, other)
    assert (other / "keep.txt").read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes", "saved_model"]


def test_whole_or_nothing_leaves_nothing_on_failure(tmp_path):
    target = tmp_path / "report.json"
    target.write_text("old")
    with pytest.raises(RuntimeError, match="interrupted"):
        with kpe.whole_or_nothing(target) as written:
            written.write_text("half")
            raise RuntimeError("interrupted")
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["report.json"]


# --------------------------------------------------------------------------------------
# The default encoders


def test_default_encoders_are_deterministic():
    spec = DEFAULT_ENCODERS["learned"]
    first, second = build_encoder(spec), build_encoder(spec)
    for a, b in zip(first.get_weights(), second.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)
    assert first.get_layer("positions").max_length == spec.max_sequence_length


def test_an_output_named_as_an_input_is_refused_before_conversion(tmp_path):
    # ONNX names a graph's inputs and outputs in one namespace: tf2onnx fails on the clash
    # with "graph input 'cache' not exist", which names neither output nor fix.
    cache = keras.Input((4,), name="cache")
    model = keras.Model(cache, {"cache": keras.layers.Dense(4)(cache)})
    with pytest.raises(kpe.ExportError, match="output 'cache' has the name of an input"):
        kpe.save_onnx(model, tmp_path / "model.onnx")
    assert not (tmp_path / "model.onnx").exists()
