"""Multi-axis models exported (SavedModel, ONNX fused and decomposed, LiteRT) and verified.

Each model takes positions with a trailing axis of coordinates, `(batch, sequence, axes)`
or `(sequence, axes)`, or makes them itself (`grid_positions` as a constant). The verifier
compares every runtime with Keras on positions that reach every table boundary on every
axis; the files' outputs are also compared with float64 numpy restatements of the
formulas (MAE's 2D table, FLUX's axial RoPE, Qwen2-VL's M-RoPE, chunked and interleaved).
Bad coordinates raise in the SavedModel and are NaN in ONNX, LiteRT and under XLA.
"""

from __future__ import annotations

import functools

import keras
import numpy as np
import onnx
import pytest
import reference
import tensorflow as tf
from float32_error import (
    assert_within_bound,
    linear_error,
    position_sum_error,
    rotation_error,
)

from keras_posenc import RotaryEmbedding, SinusoidalPositionalEncoding, grid_positions
from keras_posenc import export as kpe
from keras_posenc.export.litert import LiteRTRunner
from keras_posenc.export.verify.coverage import position_axes, probe_positions
from keras_posenc.export.verify.runtimes import onnx_session

HEADS, DIM, WIDTH = 2, 8, 8
LIMIT = 2**24
TOLERANCE = 1e-5  # each runtime against Keras
SECTION = (2, 1, 1)

# --------------------------------------------------------------------------------------
# float64 references


def _rotate(x: np.ndarray, angles: np.ndarray) -> np.ndarray:
    """Half-layout RoPE of `x` `(batch, seq, heads, D)` by `angles` `(batch, seq, D/2)`."""
    x = np.asarray(x, np.float64)
    half = x.shape[-1] // 2
    cos, sin = np.cos(angles)[:, :, None], np.sin(angles)[:, :, None]
    a, b = x[..., :half], x[..., half:]
    return np.concatenate([a * cos - b * sin, b * cos + a * sin], -1)


def _axial_angles(positions: np.ndarray, axes_dims) -> np.ndarray:
    # FLUX's EmbedND: each axis its own frequencies, concatenated in axis order.
    parts = []
    for axis, dim in enumerate(axes_dims):
        omega = 1.0 / 10000.0 ** (np.arange(0, dim, 2, dtype=np.float64) / dim)
        parts.append(positions[..., axis, None].astype(np.float64) * omega)
    return np.concatenate(parts, -1)


def _mrope_angles(positions: np.ndarray, interleaved: bool) -> np.ndarray:
    # Qwen2-VL: the 1D frequencies per axis, chunk i of the section from axis i;
    # Qwen3-VL: pairs 1, 4, 7, ... (< 3 section[1]) height, 2, 5, ... width, the rest time.
    omega = 1.0 / 10000.0 ** (np.arange(0, DIM, 2, dtype=np.float64) / DIM)
    freqs = np.moveaxis(positions.astype(np.float64), -1, 0)[..., None] * omega
    if not interleaved:
        chunks = np.split(freqs, np.cumsum(SECTION)[:-1], axis=-1)
        return np.concatenate([chunk[i] for i, chunk in enumerate(chunks)], -1)
    result = freqs[0].copy()
    for axis in (1, 2):
        index = slice(axis, SECTION[axis] * 3, 3)
        result[..., index] = freqs[axis, ..., index]
    return result


def _sinusoidal_2d(positions: np.ndarray) -> np.ndarray:
    return np.concatenate(
        [reference.sinusoidal(positions[..., a], WIDTH // 2, layout="concat") for a in (0, 1)], -1
    )


# --------------------------------------------------------------------------------------
# Models


def _attention(rope: RotaryEmbedding, axes: int, name: str) -> keras.Model:
    """Queries rotated by `rope` (an output of their own), keys too, and attention over them."""
    x = keras.Input((None, HEADS, DIM), name="x")
    positions = keras.Input((None, axes), dtype="int32", name="positions")
    rotated = rope(x, positions=positions)
    key = keras.layers.EinsumDense("bshd,hde->bshe", (None, HEADS, DIM), name="key")(x)
    keys = rope(key, positions=positions)
    scores = keras.ops.einsum("bqhd,bkhd->bhqk", rotated, keys) * float(DIM**-0.5)
    attention = keras.ops.einsum("bhqk,bkhd->bqhd", keras.ops.softmax(scores, axis=-1), x)
    return keras.Model([x, positions], {"rotated": rotated, "attention": attention}, name=name)


def _sinusoidal_2d_model() -> keras.Model:
    tokens = keras.Input((None,), dtype="int32", name="token_ids")
    positions = keras.Input((None, 2), dtype="int32", name="positions")
    embedded = keras.layers.Embedding(50, WIDTH, name="embedding")(tokens)
    encoded = SinusoidalPositionalEncoding(axes=2, layout="concat")(embedded, positions=positions)
    return keras.Model([tokens, positions], encoded, name="sinusoidal_2d")


def _shared_grid_model() -> keras.Model:
    # Positions (sequence, axes): one grid for every batch row.
    x = keras.Input((None, WIDTH), name="x")
    positions = keras.Input(batch_shape=(None, 2), dtype="int32", name="positions")
    encoded = SinusoidalPositionalEncoding(axes=2, layout="concat")(x, positions=positions)
    heads = keras.layers.Reshape((-1, HEADS, DIM))(keras.layers.Concatenate()([x, x]))
    rotated = RotaryEmbedding(axes_dims=(4, 4))(heads, positions=positions)
    return keras.Model([x, positions], {"encoded": encoded, "rotated": rotated}, name="shared_grid")


def _mrope_decoding_model() -> keras.Model:
    # Text after an image: every axis at start_index + i, a runtime start.
    x = keras.Input((None, HEADS, DIM), name="x")
    start = keras.Input(batch_shape=(), dtype="int32", name="start_index")
    rotated = RotaryEmbedding(mrope_section=SECTION)(x, start_index=start)
    return keras.Model([x, start], rotated, name="mrope_decoding")


def _constant_grid_model() -> keras.Model:
    # A ViT on a fixed 4 x 4 patch grid: the positions are part of the model.
    patches = keras.Input((16, 12), name="patches")
    embedded = keras.layers.Dense(WIDTH, name="patch_embedding")(patches)
    grid = grid_positions(4, 4)
    encoded = SinusoidalPositionalEncoding(axes=2, layout="concat")(embedded, positions=grid)
    heads = keras.layers.Reshape((16, HEADS, WIDTH // HEADS))(encoded)
    rotated = RotaryEmbedding(axes_dims=(2, 2))(heads, positions=grid)
    return keras.Model(patches, {"encoded": encoded, "rotated": rotated}, name="constant_grid")


MODELS = {
    "sinusoidal_2d": _sinusoidal_2d_model,
    "axial": lambda: _attention(RotaryEmbedding(axes_dims=(4, 4)), 2, "axial"),
    "mrope": lambda: _attention(RotaryEmbedding(mrope_section=SECTION), 3, "mrope"),
    "mrope_interleaved": lambda: _attention(
        RotaryEmbedding(mrope_section=SECTION, mrope_interleaved=True), 3, "mrope_interleaved"
    ),
    "shared_grid": _shared_grid_model,
    "mrope_decoding": _mrope_decoding_model,
    "constant_grid": _constant_grid_model,
}
# Rotations in the fused ONNX file: com.microsoft.RotaryEmbedding nodes.
ROTATIONS = {"axial": 2, "mrope": 2, "mrope_interleaved": 2, "shared_grid": 1, "mrope_decoding": 1}


SAVERS = {
    "saved_model": lambda model, path: kpe.save_saved_model(model, path / "saved_model"),
    "fused": lambda model, path: kpe.save_onnx(model, path / "fused.onnx", rotary="fused"),
    "decomposed": lambda model, path: kpe.save_onnx(
        model, path / "decomposed.onnx", rotary="decomposed"
    ),
    "litert": lambda model, path: kpe.save_litert(model, path / "model.tflite"),
}


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """`exported(name)` -> `(model, artifact(kind) -> path)`, each made once, on demand."""
    folder = tmp_path_factory.mktemp("axes_export")

    @functools.cache
    def model(name: str) -> keras.Model:
        (folder / name).mkdir()
        return MODELS[name]()

    @functools.cache
    def artifact(name: str, kind: str):
        return SAVERS[kind](model(name), folder / name)

    return lambda name: (model(name), functools.partial(artifact, name))


def _onnx_session(path) -> tuple:
    session = onnx_session(path)
    return session, [o.name for o in session.get_outputs()]


def _covers(runs: list[list[int]], values: np.ndarray) -> bool:
    return all(any(first <= v <= last for first, last in runs) for v in values)


# --------------------------------------------------------------------------------------
# Verification on every runtime


# "constant_grid": the rows of a fixed grid are folded into initializers, with no node that
# makes them (the fused pass once failed on them; 1D RoPE on a fixed length does the same).
VERIFIED = [(name, rotary) for name in MODELS for rotary in ("fused", "decomposed")]


@pytest.mark.parametrize(("name", "rotary"), VERIFIED)
def test_multi_axis_models_verify_on_every_runtime(exported, name, rotary):
    # The SavedModel and LiteRT files are verified once, with the decomposed ONNX file.
    model, artifact = exported(name)
    others = {}
    if rotary == "decomposed":
        others["saved_model_path"] = artifact("saved_model")
        others["litert_path"] = artifact("litert")
    report = kpe.verify_export(
        model,
        onnx_path=artifact(rotary),
        batch_sizes=(1, 2),
        sequence_lengths=(3, 17),
        repeats=1,
        **others,
    )
    assert report["passed"]
    for runtime in report["runtimes"][1:]:
        assert report["summary"][runtime]["max_abs_error"] <= TOLERANCE, runtime
    axes = position_axes(model)
    if axes:
        # Every axis on its own reaches every table boundary, up to the largest position.
        (axis_count,) = axes.values()
        per_axis = report["positions"]["covered_per_axis"]["positions"]
        assert len(per_axis) == axis_count
        for runs in per_axis:
            assert _covers(runs, probe_positions(LIMIT))
            assert _covers(runs, [4095, 4096, 4097, LIMIT - 1])


@pytest.mark.parametrize("name", [*ROTATIONS, "constant_grid"])
def test_fused_onnx_uses_the_kernel_and_decomposed_does_not(exported, name):
    _, artifact = exported(name)
    counts = {}
    for form in ("fused", "decomposed"):
        nodes = onnx.load(str(artifact(form))).graph.node
        counts[form] = sum(n.op_type == "RotaryEmbedding" for n in nodes)
    assert counts == {"fused": ROTATIONS.get(name, 1), "decomposed": 0}


def _feeds(model: keras.Model, batch: int = 2, sequence: int = 32) -> dict[str, np.ndarray]:
    return kpe.default_inputs(model, batch, sequence, probe_offset=0)


def _expected(name: str, model: keras.Model, feeds: dict) -> dict[str | None, np.ndarray]:
    """`{output name: float64 value}`; None names a model's only output."""
    positions = feeds["positions"]
    if name == "sinusoidal_2d":
        table = model.get_layer("embedding").embeddings.numpy().astype(np.float64)
        return {None: table[feeds["token_ids"]] + _sinusoidal_2d(positions)}
    if name == "shared_grid":
        x = feeds["x"]
        heads = np.concatenate([x, x], -1).reshape(*x.shape[:2], HEADS, DIM)
        angles = np.broadcast_to(_axial_angles(positions, (4, 4)), (*x.shape[:2], DIM // 2))
        return {
            "encoded": x + _sinusoidal_2d(positions)[None],
            "rotated": _rotate(heads, angles),
        }
    angles = {
        "axial": lambda p: _axial_angles(p, (4, 4)),
        "mrope": lambda p: _mrope_angles(p, interleaved=False),
        "mrope_interleaved": lambda p: _mrope_angles(p, interleaved=True),
    }[name](positions)
    return {"rotated": _rotate(feeds["x"], angles)}


@pytest.mark.parametrize(
    "name", ["sinusoidal_2d", "shared_grid", "axial", "mrope", "mrope_interleaved"]
)
def test_exported_files_are_the_formulas_at_every_table_boundary(exported, name):
    model, artifact = exported(name)
    feeds = _feeds(model)
    for axis in range(feeds["positions"].shape[-1]):
        assert set(probe_positions(LIMIT)) <= set(feeds["positions"][..., axis].ravel())
    expected = _expected(name, model, feeds)
    session, names = _onnx_session(artifact("fused"))
    onnx_outputs = dict(zip(names, session.run(None, feeds), strict=True))
    litert_outputs = LiteRTRunner(artifact("litert"))(feeds)
    for runtime, outputs in (("onnxruntime", onnx_outputs), ("litert", litert_outputs)):
        if None in expected:
            assert len(outputs) == 1
            outputs = {None: next(iter(outputs.values()))}
        assert set(expected) <= set(outputs)
        for key, value in expected.items():
            bound = _bounds(name, model, feeds)[key]
            assert_within_bound(outputs[key], value, bound, what=f"{runtime} {key}")


def _bounds(name: str, model: keras.Model, feeds: dict) -> dict[str | None, np.ndarray]:
    """`_expected`'s float32 bounds: a sum with a table (`position_sum_error`), a RoPE
    (`rotation_error`); the embedding rows and inputs are float32, exact."""
    if name == "sinusoidal_2d":
        table = model.get_layer("embedding").embeddings.numpy().astype(np.float64)
        return {None: position_sum_error(table[feeds["token_ids"]])}
    x = feeds["x"]
    if name == "shared_grid":
        heads = np.concatenate([x, x], -1).reshape(*x.shape[:2], HEADS, DIM)
        return {"encoded": position_sum_error(x), "rotated": rotation_error(heads)}
    return {"rotated": rotation_error(x)}


def test_mrope_decoding_files_are_plain_rope_from_the_start(exported):
    # Text tokens: every axis at the same position, so M-RoPE is 1D RoPE from the start.
    model, artifact = exported("mrope_decoding")
    x = np.random.default_rng(1).standard_normal((2, 9, HEADS, DIM)).astype(np.float32)
    session, _ = _onnx_session(artifact("fused"))
    litert = LiteRTRunner(artifact("litert"))
    for start in (0, 4090, LIMIT - 9):
        feeds = {"x": x, "start_index": np.array(start, np.int32)}
        expected = reference.rotary(x, np.arange(start, start + 9))
        for runtime, got in (
            ("onnxruntime", session.run(None, feeds)[0]),
            ("litert", next(iter(litert(feeds).values()))),
        ):
            bound = rotation_error(x)
            assert_within_bound(got, expected, bound, what=f"{runtime} from {start}")


def test_constant_grid_files_are_the_formulas(exported):
    model, artifact = exported("constant_grid")
    patches = np.random.default_rng(0).standard_normal((3, 16, 12)).astype(np.float32)
    layer = model.get_layer("patch_embedding")
    embedded = patches @ layer.kernel.numpy().astype(np.float64) + layer.bias.numpy()
    grid = grid_positions(4, 4)
    encoded = embedded + _sinusoidal_2d(grid)[None]
    heads = encoded.reshape(3, 16, HEADS, WIDTH // HEADS)
    rotated = _rotate(heads, np.broadcast_to(_axial_angles(grid, (2, 2)), (3, 16, 2)))
    session, names = _onnx_session(artifact("decomposed"))
    runs = {
        "onnxruntime": lambda: dict(
            zip(names, session.run(None, {"patches": patches}), strict=True)
        ),
        "litert": lambda: LiteRTRunner(artifact("litert"))({"patches": patches}),
    }
    # The Dense (12 inputs), the sum with the table, then RoPE of that sum: the error carried
    # into a rotated pair moves each output by at most twice the head's largest error.
    dense_error = linear_error(patches.astype(np.float64), layer.kernel.numpy(), layer.bias.numpy())
    encoded_error = dense_error + position_sum_error(np.abs(embedded) + dense_error)
    heads_error = encoded_error.reshape(heads.shape)
    rotated_error = rotation_error(np.abs(heads) + heads_error) + 2 * heads_error.max(
        -1, keepdims=True
    )
    for runtime, run in runs.items():
        outputs = run()
        assert_within_bound(outputs["encoded"], encoded, encoded_error, what=runtime)
        assert_within_bound(outputs["rotated"], rotated, rotated_error, what=runtime)


def test_positions_of_several_axes_are_told_apart_from_1d_positions(exported):
    assert position_axes(exported("mrope")[0]) == {"positions": 3}
    assert position_axes(exported("shared_grid")[0]) == {"positions": 2}
    assert position_axes(exported("constant_grid")[0]) == {}
    # The trailing axis of coordinates stays static in the exported signature.
    shapes = {spec.name: spec.shape.as_list() for spec in kpe.input_signature(exported("mrope")[0])}
    assert shapes["positions"] == [None, None, 3]
    shapes = {s.name: s.shape.as_list() for s in kpe.input_signature(exported("shared_grid")[0])}
    assert shapes["positions"] == [None, 2]
    feeds = _feeds(exported("shared_grid")[0], batch=3, sequence=5)
    assert feeds["x"].shape == (3, 5, WIDTH) and feeds["positions"].shape == (5, 2)
    # The axes take the probes in different orders: a token's coordinates differ.
    positions = _feeds(exported("mrope")[0])["positions"].reshape(-1, 3)
    assert (positions[:, 0] != positions[:, 1]).all() and (positions[:, 1] != positions[:, 2]).all()


# --------------------------------------------------------------------------------------
# Bad coordinates


@pytest.fixture(scope="module")
def bad_coordinates_files(tmp_path_factory):
    x = keras.Input((None, WIDTH), name="x")
    heads = keras.Input((None, HEADS, DIM), name="heads")
    grid = keras.Input((None, 2), dtype="int32", name="grid_positions")
    multimodal = keras.Input((None, 3), dtype="int32", name="mrope_positions")
    outputs = {
        "sinusoidal": SinusoidalPositionalEncoding(axes=2)(x, positions=grid),
        "axial": RotaryEmbedding(axes_dims=(4, 4))(heads, positions=grid),
        "mrope": RotaryEmbedding(mrope_section=SECTION)(heads, positions=multimodal),
        "mrope_interleaved": RotaryEmbedding(mrope_section=SECTION, mrope_interleaved=True)(
            heads, positions=multimodal
        ),
    }
    inputs = {"x": x, "heads": heads, "grid_positions": grid, "mrope_positions": multimodal}
    model = keras.Model(inputs, outputs)
    folder = tmp_path_factory.mktemp("bad_coordinates")
    serve = tf.saved_model.load(str(kpe.save_saved_model(model, folder / "saved_model")))
    serve = serve.signatures["serving_default"]
    session, names = _onnx_session(kpe.save_onnx(model, folder / "model.onnx"))
    litert = LiteRTRunner(kpe.save_litert(model, folder / "model.tflite"))
    return {
        "saved_model": lambda feeds: {
            k: v.numpy() for k, v in serve(**{n: tf.constant(a) for n, a in feeds.items()}).items()
        },
        "onnxruntime": lambda feeds: dict(zip(names, session.run(None, feeds), strict=True)),
        "litert": litert,
        "xla": tf.function(lambda feeds: model(feeds), jit_compile=True),
    }


USES = {
    "grid_positions": ("sinusoidal", "axial"),
    "mrope_positions": ("mrope", "mrope_interleaved"),
}
# (input, axis, value): one bad coordinate on one axis, the others good.
BAD_COORDINATES = [
    ("grid_positions", 1, -1),
    ("grid_positions", 0, LIMIT),
    ("grid_positions", 1, 2**31 - 1),
    ("mrope_positions", 2, -1),
    ("mrope_positions", 1, LIMIT),
    ("mrope_positions", 0, -(2**31)),
]


def _bad_feeds(name: str, axis: int, value: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    feeds = {
        "x": rng.standard_normal((2, 3, WIDTH)).astype(np.float32),
        "heads": rng.standard_normal((2, 3, HEADS, DIM)).astype(np.float32),
        "grid_positions": rng.integers(0, LIMIT, (2, 3, 2)).astype(np.int32),
        "mrope_positions": rng.integers(0, LIMIT, (2, 3, 3)).astype(np.int32),
    }
    feeds[name][1, 2, axis] = value
    return feeds


@pytest.mark.parametrize("runtime", ["saved_model", "onnxruntime", "litert", "xla"])
@pytest.mark.parametrize(("name", "axis", "value"), BAD_COORDINATES)
def test_a_bad_coordinate_on_one_axis_raises_or_is_nan(
    bad_coordinates_files, runtime, name, axis, value
):
    run = bad_coordinates_files[runtime]
    feeds = _bad_feeds(name, axis, value)
    if runtime == "saved_model":  # it keeps the assertions
        expected = r"positions must be >= 0" if value < 0 else r"the largest position is"
        with pytest.raises(tf.errors.InvalidArgumentError, match=expected):
            run(feeds)
        return
    outputs = {k: np.asarray(v) for k, v in run(feeds).items()}
    for output, value_ in outputs.items():
        if output in USES[name]:
            assert np.isnan(value_[1, 2]).all(), f"{runtime}: finite {output} at the bad step"
        else:
            assert np.isfinite(value_).all(), f"{runtime}: {output} is poisoned by {name}"


# --------------------------------------------------------------------------------------
# XLA with grids of different sizes


@pytest.mark.parametrize("kind", ["axial", "mrope", "mrope_interleaved"])
def test_multi_axis_rope_under_xla_with_dynamic_grid_sizes(kind):
    layer = {
        "axial": RotaryEmbedding(axes_dims=(4, 4)),
        "mrope": RotaryEmbedding(mrope_section=SECTION),
        "mrope_interleaved": RotaryEmbedding(mrope_section=SECTION, mrope_interleaved=True),
    }[kind]
    axes = 2 if kind == "axial" else 3
    rotate = tf.function(
        lambda x, p: layer(x, positions=p),
        input_signature=[
            tf.TensorSpec([None, None, HEADS, DIM]),
            tf.TensorSpec([None, None, axes], tf.int32),
        ],
        jit_compile=True,
    )
    rng = np.random.default_rng(5)
    # Grids of three sizes, the second across the cached rows, the third far past them.
    for height, width, frames, offset in ((2, 3, 1, 0), (4, 5, 2, 4090), (3, 3, 1, 10**7)):
        grid = grid_positions(height, width, frames=None if axes == 2 else frames)
        positions = np.stack([grid + offset, grid[::-1] + offset // 2 + 5])
        x = rng.standard_normal((2, len(grid), HEADS, DIM)).astype(np.float32)
        angles = (
            _axial_angles(positions, (4, 4))
            if kind == "axial"
            else _mrope_angles(positions, interleaved=kind == "mrope_interleaved")
        )
        assert_within_bound(rotate(x, positions), _rotate(x, angles), rotation_error(x))
    assert rotate.experimental_get_tracing_count() == 1  # XLA compiles once per shape
