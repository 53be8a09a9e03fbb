"""A verifier that reaches every row: starts, positions, fixed axes, tampered tables.

Each position table of an exported file is changed by 1e-3 in one row near its end, and
`verify_export` must fail: the cached rows (4096), the split tables (fine rows and coarse
rows), a learned table; for a `start_index` input and a `positions` input alike, for each
layer kind, and for a decoding encoder. The tables are found by their shapes, not by
anything the package reports. Models are tiny and exported once per module.
"""

from __future__ import annotations

from pathlib import Path

import keras
import numpy as np
import onnx
import pytest
import tensorflow as tf
from onnx import numpy_helper

from keras_posenc import LearnedPositionalEmbedding, RotaryEmbedding, SinusoidalPositionalEncoding
from keras_posenc import export as kpe
from keras_posenc_cli.encoders import EncoderSpec, build_encoder

CACHED = 4096  # rows of the cached table and of each split table
MAX_POSITIONS = CACHED * CACHED
GRID = {"batch_sizes": (1,), "sequence_lengths": (2, 17), "repeats": 1}
LEARNED_LENGTH = 64
WIDTH = 4


def _model(kind: str, position_input: str) -> keras.Model:
    shape = (None, 1, WIDTH) if kind == "rotary" else (None, WIDTH)
    x = keras.Input(shape, name="x")
    if position_input == "start_index":
        where = keras.Input(batch_shape=(), dtype="int32", name="start_index")
    else:
        where = keras.Input((None,), dtype="int32", name="where")  # found by use, not name
    layer = {
        "sinusoidal": lambda: SinusoidalPositionalEncoding(),
        "learned": lambda: LearnedPositionalEmbedding(LEARNED_LENGTH),
        "rotary": lambda: RotaryEmbedding(),
    }[kind]()
    y = layer(x, **{position_input: where})
    return keras.Model({"x": x, where.name: where}, {"y": y}, name=f"{kind}_{position_input}")


CASES = [
    ("sinusoidal", "start_index"),
    ("sinusoidal", "positions"),
    ("learned", "start_index"),
    ("learned", "positions"),
    ("rotary", "start_index"),
    ("rotary", "positions"),
]


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """`{(kind, input): (model, onnx path)}`, each converted once."""
    folder = tmp_path_factory.mktemp("coverage")
    result = {}
    for kind, position_input in CASES:
        model = _model(kind, position_input)
        path = kpe.save_onnx(model, folder / f"{kind}_{position_input}.onnx")
        result[kind, position_input] = model, path
    return result


def _tables(proto, rows: int) -> list:
    """The float initializers with `rows` rows: the position tables of a tiny model."""
    return [
        i
        for i in proto.graph.initializer
        if len(i.dims) == 2 and i.dims[0] == rows and i.data_type == onnx.TensorProto.FLOAT
    ]


def _tampered(path: Path, table_index: int, row: int, rows: int, out: Path) -> Path:
    proto = onnx.load(str(path))
    table = _tables(proto, rows)[table_index]
    values = numpy_helper.to_array(table).copy()
    values[row] += np.float32(1e-3)
    table.CopyFrom(numpy_helper.from_array(values, table.name))
    onnx.save(proto, str(out))
    return out


@pytest.mark.parametrize("kind, position_input", CASES)
def test_verification_passes_and_reports_its_coverage(exported, kind, position_input):
    model, path = exported[kind, position_input]
    report = kpe.verify_export(model, None, path, **GRID)
    assert report["passed"], report["summary"]
    limit = LEARNED_LENGTH if kind == "learned" else MAX_POSITIONS
    positions = report["positions"]
    assert positions["limit"] == limit
    name = "start_index" if position_input == "start_index" else "where"
    assert positions["inputs"] == {name: position_input}
    covered = np.concatenate([np.arange(a, b + 1) for a, b in positions["covered"]])
    # the first rows, both sides of the end of the cached rows, the last rows allowed
    wanted = {0, 1, limit - 2, limit - 1}
    if limit > CACHED:
        wanted |= {CACHED - 2, CACHED - 1, CACHED, CACHED + 1, 2 * CACHED - 1, 2 * CACHED}
        wanted |= {limit - CACHED - 1, limit - CACHED}
    assert wanted <= set(covered.tolist())
    assert covered.max() == limit - 1


@pytest.mark.parametrize("kind, position_input", CASES)
def test_a_row_changed_near_the_end_of_any_table_fails(exported, kind, position_input, tmp_path):
    model, path = exported[kind, position_input]
    rows = LEARNED_LENGTH if kind == "learned" else CACHED
    tables = _tables(onnx.load(str(path)), rows)
    # a learned table; or the split tables (fine and coarse, sin and cos), with the cached
    # rows when a start index slices them
    assert len(tables) == 1 if kind == "learned" else len(tables) >= 4, [t.dims for t in tables]
    for index in range(len(tables)):
        tampered = _tampered(path, index, rows - 2, rows, tmp_path / f"t{index}.onnx")
        report = kpe.verify_export(model, None, tampered, raise_on_failure=False, **GRID)
        assert not report["passed"], (index, tables[index].name)
        assert report["summary"]["onnxruntime"]["max_abs_error"] >= 5e-4


def test_the_verifier_of_today_would_pass_a_tampered_cache_end(exported, tmp_path):
    # The reason for the starts: from 0 alone the changed row is never read.
    model, path = exported["sinusoidal", "start_index"]
    tampered = _tampered(path, 0, CACHED - 2, CACHED, tmp_path / "t.onnx")

    def from_zero(batch, sequence):
        x = np.random.default_rng(0).standard_normal((batch, sequence, WIDTH))
        return {"x": x.astype(np.float32), "start_index": np.array(0, np.int32)}

    report = kpe.verify_export(
        model, None, tampered, make_inputs=from_zero, raise_on_failure=False, **GRID
    )
    assert all(case["passed"] for case in report["cases"])  # the cases alone pass
    assert not report["tables"]["onnxruntime"]["passed"]  # the audit of every row does not
    with pytest.raises(kpe.VerificationError, match="onnxruntime"):
        kpe.verify_export(model, None, tampered, **GRID)


def test_without_position_inputs_every_cached_row_is_reached(tmp_path):
    x = keras.Input((None, WIDTH), name="x")
    model = keras.Model(x, {"y": SinusoidalPositionalEncoding()(x)})
    path = kpe.save_onnx(model, tmp_path / "model.onnx")
    report = kpe.verify_export(model, None, path, **GRID)
    assert report["passed"], report["summary"]
    shapes = {(c["batch"], c["sequence"]) for c in report["cases"]}
    assert {(1, CACHED), (1, CACHED + 17)} <= shapes
    assert report["positions"]["covered"] == [[0, CACHED + 16]]
    # The cached rows (the split tables serve only the 17 steps past them here).
    tables = _tables(onnx.load(str(path)), CACHED)
    (cached,) = [i for i, table in enumerate(tables) if table.dims[1] == WIDTH]
    tampered = _tampered(path, cached, CACHED - 2, CACHED, tmp_path / "tampered.onnx")
    report = kpe.verify_export(model, None, tampered, raise_on_failure=False, **GRID)
    assert not report["passed"]


@pytest.fixture(scope="module")
def decoder(tmp_path_factory):
    spec = EncoderSpec(
        "tiny", "rotary", vocabulary_size=11, width=8, num_heads=2, num_blocks=1,
        feed_forward_dim=8, seed=5,
    )  # fmt: skip
    model = build_encoder(spec, decoding=True)
    folder = tmp_path_factory.mktemp("decoder")
    return model, kpe.save_onnx(model, folder / "decoder.onnx")


def test_a_decoder_with_a_start_index_fails_on_a_tampered_table(decoder, tmp_path):
    model, path = decoder
    report = kpe.verify_export(model, None, path, **GRID)
    assert report["passed"], report["summary"]
    assert [a for a, _ in report["positions"]["covered"]][:1] == [0]
    assert report["positions"]["covered"][-1][1] == MAX_POSITIONS - 1
    tables = _tables(onnx.load(str(path)), CACHED)
    assert tables
    for index in range(len(tables)):
        tampered = _tampered(path, index, CACHED - 2, CACHED, tmp_path / f"t{index}.onnx")
        report = kpe.verify_export(model, None, tampered, raise_on_failure=False, **GRID)
        assert not report["passed"], tables[index].name


@pytest.mark.parametrize(
    "sizes, message",
    [
        ({"batch_sizes": (0,)}, "positive"),
        ({"batch_sizes": ()}, "empty"),
        ({"batch_sizes": (-1, 2)}, "positive"),
        ({"sequence_lengths": (2.5,)}, "integers"),
        ({"sequence_lengths": (True,)}, "integers"),
        ({"sequence_lengths": "17"}, "sequence of positive integers"),
        ({"max_sequence_length": 0}, "max_sequence_length"),
        ({"max_sequence_length": LEARNED_LENGTH + 1}, "learned position table has 64 rows"),
    ],
)
def test_bad_sizes_are_a_clear_error(exported, sizes, message):
    model, path = exported["learned", "start_index"]
    with pytest.raises(ValueError, match=message):
        kpe.verify_export(model, None, path, **{"repeats": 1, **sizes})


def test_nothing_to_verify_is_an_error(exported):
    model, _ = exported["sinusoidal", "start_index"]
    with pytest.raises(ValueError, match="Nothing to verify"):
        kpe.verify_export(model)


# --------------------------------------------------------------------------------------
# Sizes the model fixes


@pytest.fixture(scope="module")
def fixed(tmp_path_factory):
    """Token ids of a fixed length 16 and four features per example (axis 1 not a sequence)."""
    token_ids = keras.Input((16,), dtype="int32", name="token_ids")
    features = keras.Input((4,), name="features")
    hidden = keras.layers.Embedding(7, 4)(token_ids)
    hidden = SinusoidalPositionalEncoding()(hidden)
    hidden = hidden + keras.layers.Dense(4)(features)[:, None, :]
    model = keras.Model({"token_ids": token_ids, "features": features}, {"y": hidden})
    folder = tmp_path_factory.mktemp("fixed")
    saved = kpe.save_saved_model(model, folder / "saved_model")
    onnx_path = kpe.save_onnx(model, folder / "model.onnx")
    return model, saved, onnx_path


def test_fixed_sizes_are_kept_in_every_signature(fixed):
    model, saved, onnx_path = fixed
    specs = {s.name: s.shape.as_list() for s in kpe.input_signature(model)}
    assert specs == {"token_ids": [None, 16], "features": [None, 4]}
    signature = tf.saved_model.load(str(saved)).signatures["serving_default"]
    shapes = {k: v.shape.as_list() for k, v in signature.structured_input_signature[1].items()}
    assert shapes == specs
    dims = {
        i.name: [d.dim_value or d.dim_param for d in i.type.tensor_type.shape.dim]
        for i in onnx.load(str(onnx_path)).graph.input
    }
    assert dims == {"token_ids": ["batch", 16], "features": ["batch", 4]}


def test_verification_uses_the_lengths_the_model_accepts(fixed):
    model, saved, onnx_path = fixed
    report = kpe.verify_export(model, saved, onnx_path, batch_sizes=(1, 3), repeats=1)
    assert report["passed"], report["summary"]
    assert {(c["batch"], c["sequence"]) for c in report["cases"]} == {(1, 16), (3, 16)}


def test_a_cache_bounds_the_steps_not_the_positions_of_a_positions_input(tmp_path):
    # A decode step that takes its RoPE positions as an input: the cache's slots bound how
    # many steps it holds, not which positions it rotates by, so the probes must still
    # reach the end of the split tables (the positions are not slots).
    from keras_posenc import RotaryGroupQueryAttention

    slots = 8
    x = keras.Input((None, WIDTH), name="x")
    where = keras.Input((None,), dtype="int32", name="where")
    cache = keras.Input((2, slots, 1, WIDTH), name="cache")
    index = keras.Input(batch_shape=(), dtype="int32", name="cache_update_index")
    attention = RotaryGroupQueryAttention(num_query_heads=1, num_key_value_heads=1, head_dim=WIDTH)
    y, new_cache = attention(
        x,
        x,
        query_positions=where,
        key_positions=where,
        cache=cache,
        cache_update_index=index,
    )
    model = keras.Model(
        {"x": x, "where": where, "cache": cache, "cache_update_index": index},
        {"y": y, "next_cache": new_cache},
    )
    path = kpe.save_onnx(model, tmp_path / "step.onnx")
    report = kpe.verify_export(model, None, path, batch_sizes=(1,), sequence_lengths=(1,))
    assert report["passed"], report["summary"]
    positions = report["positions"]
    assert positions["limit"] == MAX_POSITIONS
    covered = np.concatenate([np.arange(a, b + 1) for a, b in positions["covered"]])
    assert {CACHED, 2 * CACHED - 1, MAX_POSITIONS - 1} <= set(covered.tolist())
