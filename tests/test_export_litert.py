"""LiteRT (`save_litert`): built-in ops only, dynamic where the model allows, verified.

Every layer and option of the package converts with LiteRT's built-in ops and verifies
against Keras on the same coverage as the other runtimes (starts and positions that reach
every table's first and last rows). Op lists are read from the flatbuffer itself, sizes
are compared with bytes computed here from the shapes. Models are tiny and each is
converted once per module.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest

from keras_posenc import (
    LearnedPositionalEmbedding,
    RotaryEmbedding,
    RotaryMultiHeadAttention,
    SinusoidalPositionalEncoding,
)
from keras_posenc import export as kpe
from keras_posenc_cli.encoders import DEFAULT_ENCODERS, EncoderSpec, build_encoder

GRID = {"batch_sizes": (1, 2), "sequence_lengths": (2, 17), "repeats": 1}
CACHED = 4096
HEAD_DIM = 8
DYNAMIC = {"rope_type": "dynamic", "factor": 2.0, "max_position_embeddings": 64}
# Dynamic NTK is verified apart, from starts below 1000: its frequencies are made at run
# time by float32 exp/log, whose last bit differs between TensorFlow and LiteRT, and the
# angle carries that difference times the position (2.5e-5 at 8190, 2e-2 near 2^24).
SCALINGS = {
    "linear": {"rope_type": "linear", "factor": 2.0},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4096},
    "longrope": {
        "rope_type": "longrope",
        "short_factor": [1.0, 1.1, 1.3, 1.7],
        "long_factor": [1.0, 2.0, 4.0, 8.0],
        "original_max_position_embeddings": 4096,
        "max_position_embeddings": 131072,
    },
    "llama3": {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    },
}


def _flex(ops: list[str]) -> list[str]:
    return sorted({op for op in ops if op.startswith("Flex")})


def _options_model() -> keras.Model:
    """Each option of the rotary and sinusoidal layers, each an output, from one start."""
    embeddings = keras.Input((None, 8), name="embeddings")
    heads = keras.Input((None, 2, HEAD_DIM), name="heads")
    start = keras.Input(batch_shape=(), dtype="int32", name="start_index")
    outputs = {
        "sinusoidal_interleaved": SinusoidalPositionalEncoding()(embeddings, start_index=start),
        "sinusoidal_concat": SinusoidalPositionalEncoding(layout="concat")(
            embeddings, start_index=start
        ),
        "rotary_half": RotaryEmbedding()(heads, start_index=start),
        "rotary_interleaved_partial": RotaryEmbedding(layout="interleaved", rotary_dim=4)(
            heads, start_index=start
        ),
    }
    for name, scaling in SCALINGS.items():
        outputs[f"rope_{name}"] = RotaryEmbedding(scaling=scaling)(heads, start_index=start)
    inputs = {"embeddings": embeddings, "heads": heads, "start_index": start}
    return keras.Model(inputs, outputs, name="options")


def _positions_model() -> keras.Model:
    embeddings = keras.Input((None, 8), name="embeddings")
    heads = keras.Input((None, 2, HEAD_DIM), name="heads")
    positions = keras.Input((None,), dtype="int32", name="positions")
    outputs = {
        "sinusoidal": SinusoidalPositionalEncoding()(embeddings, positions=positions),
        "rotary": RotaryEmbedding(layout="interleaved")(heads, positions=positions),
    }
    inputs = {"embeddings": embeddings, "heads": heads, "positions": positions}
    return keras.Model(inputs, outputs, name="positions")


def _learned_model() -> keras.Model:
    embeddings = keras.Input((None, 8), name="embeddings")
    start = keras.Input(batch_shape=(), dtype="int32", name="start_index")
    positions = keras.Input((None,), dtype="int32", name="positions")
    table = LearnedPositionalEmbedding(64, name="table")
    outputs = {
        "from_start": table(embeddings, start_index=start),
        "at_positions": table(embeddings, positions=positions),
    }
    inputs = {"embeddings": embeddings, "start_index": start, "positions": positions}
    return keras.Model(inputs, outputs, name="learned")


def _attention_model() -> keras.Model:
    """RotaryMultiHeadAttention alone: not causal, causal, and from a start index."""
    x = keras.Input((None, 8), name="x")
    start = keras.Input(batch_shape=(), dtype="int32", name="start_index")
    attention = RotaryMultiHeadAttention(2, 4, name="attention")
    causal = RotaryMultiHeadAttention(2, 4, rotary_layout="interleaved", name="causal")
    outputs = {
        "attended": attention(x, x, query_start_index=start, key_start_index=start),
        "causal": causal(x, x, use_causal_mask=True),
    }
    return keras.Model({"x": x, "start_index": start}, outputs, name="attention")


def _tiny_encoder(position: str, decoding: bool) -> keras.Model:
    spec = EncoderSpec(
        f"{position}_{'decoder' if decoding else 'encoder'}", position, vocabulary_size=11,
        width=8, num_heads=2, num_blocks=1, feed_forward_dim=8, max_sequence_length=64,
    )  # fmt: skip
    return build_encoder(spec, decoding=decoding)


MODELS = {
    "options": _options_model,
    "positions": _positions_model,
    "learned": _learned_model,
    "attention": _attention_model,
    **{
        f"{position}_{kind}": (lambda p=position, d=kind == "decoder": _tiny_encoder(p, d))
        for position in ("sinusoidal", "learned", "rotary")
        for kind in ("encoder", "decoder")
    },
}


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """`{name: (model, .tflite path)}`, each model converted once."""
    folder = tmp_path_factory.mktemp("litert")
    result = {}
    for name, make in MODELS.items():
        model = make()
        try:
            path = kpe.save_litert(model, folder / f"{name}.tflite")
        except kpe.ExportError as error:
            path = error
        result[name] = model, path
    return result


@pytest.mark.parametrize("name", list(MODELS))
def test_converts_with_built_in_ops_and_verifies(converted, name):
    model, path = converted[name]
    assert not isinstance(path, Exception), str(path)
    ops = kpe.litert_ops(path.read_bytes())
    assert ops and _flex(ops) == []
    report = kpe.verify_export(model, litert_path=path, **GRID)
    assert report["passed"], report["summary"]
    assert report["summary"]["litert"]["max_abs_error"] <= 1e-5
    if report["positions"]["inputs"]:  # the largest allowed position was reached
        assert report["positions"]["covered"][-1][1] == report["positions"]["limit"] - 1


def test_dynamic_axes_resize_and_fixed_ones_do_not(converted, tmp_path):
    _, path = converted["rotary_encoder"]
    runner = kpe.litert.LiteRTRunner(path)
    assert runner.signatures == {"token_ids": (-1, -1)}
    for shape in ((1, 3), (4, 130)):
        (output,) = runner({"token_ids": np.zeros(shape, np.int32)}).values()
        assert output.shape == (*shape, 8)

    token_ids = keras.Input((16,), dtype="int32", name="token_ids")
    hidden = SinusoidalPositionalEncoding()(keras.layers.Embedding(7, 4)(token_ids))
    model = keras.Model(token_ids, {"y": hidden})
    fixed = kpe.save_litert(model, tmp_path / "fixed.tflite")
    runner = kpe.litert.LiteRTRunner(fixed)
    assert runner.signatures == {"token_ids": (-1, 16)}
    assert runner({"token_ids": np.zeros((3, 16), np.int32)})["y"].shape == (3, 16, 4)
    with pytest.raises(ValueError, match="takes input 'token_ids' with shape"):
        runner({"token_ids": np.zeros((3, 17), np.int32)})
    report = kpe.verify_export(model, litert_path=fixed, **GRID)
    assert {c["sequence"] for c in report["cases"]} == {16} and report["passed"]


def test_a_tampered_cached_row_fails(converted, tmp_path):
    # The sinusoidal table's row 4094, found by its bytes in the file, changed by 1e-3.
    model, path = converted["options"]
    data = bytearray(path.read_bytes())
    angles = 4094 * 10000.0 ** (-np.arange(0, 8, 2) / 8)
    row = np.empty(8, np.float32)
    row[0::2], row[1::2] = np.sin(angles), np.cos(angles)
    offset = data.find(row.tobytes())
    assert offset > 0
    data[offset : offset + 32] = (row + np.float32(1e-3)).tobytes()
    tampered = tmp_path / "tampered.tflite"
    tampered.write_bytes(bytes(data))
    report = kpe.verify_export(model, litert_path=tampered, raise_on_failure=False, **GRID)
    assert not report["passed"]
    assert report["summary"]["litert"]["max_abs_error"] >= 5e-4


def test_a_flex_op_is_refused_with_the_op_and_the_layer(tmp_path):
    # Keras's own causal path indexes its mask with new axes, a Flex StridedSlice.
    x = keras.Input((None, 8), name="x")
    attention = keras.layers.MultiHeadAttention(2, 4, name="keras_attention")
    model = keras.Model(x, attention(x, x, use_causal_mask=True))
    with pytest.raises(kpe.ExportError, match=r"StridedSlice.*keras_attention"):
        kpe.save_litert(model, tmp_path / "model.tflite")
    assert list(tmp_path.iterdir()) == []


def test_keras_own_litert_export_gets_no_flex_op_from_our_layers(tmp_path):
    heads = keras.Input((None, 2, HEAD_DIM), name="heads")
    x = keras.layers.Reshape((-1, 2 * HEAD_DIM))(RotaryEmbedding()(heads))
    x = SinusoidalPositionalEncoding()(x)
    x = LearnedPositionalEmbedding(32)(x)
    model = keras.Model(heads, x)
    path = tmp_path / "keras.tflite"
    model.export(str(path), format="litert", verbose=False)
    assert _flex(kpe.litert_ops(path.read_bytes())) == []


def test_dynamic_scaling_verifies_from_starts_below_its_float32_limit(tmp_path):
    heads = keras.Input((None, 2, HEAD_DIM), name="heads")
    start = keras.Input(batch_shape=(), dtype="int32", name="start_index")
    rotated = RotaryEmbedding(scaling=DYNAMIC)(heads, start_index=start)
    model = keras.Model({"heads": heads, "start_index": start}, {"rotated": rotated})
    path = kpe.save_litert(model, tmp_path / "dynamic.tflite")
    for first in (0, 60, 900):  # short branch; across max_position_embeddings; past it

        def inputs(batch, sequence, first=first):
            x = np.random.default_rng([batch, sequence]).standard_normal(
                (batch, sequence, 2, HEAD_DIM)
            )
            return {"heads": x.astype(np.float32), "start_index": np.array(first, np.int32)}

        report = kpe.verify_export(model, litert_path=path, make_inputs=inputs, **GRID)
        assert report["passed"], (first, report["summary"])


def _table_bytes(width: int, rotary: bool) -> int:
    """One copy of a layer's tables, from shapes: the cached rows and the four split tables."""
    cached = (2 if rotary else 1) * CACHED * width * 4  # cos and sin for RoPE, one table else
    split = 4 * CACHED * (width // 2) * 4  # fine and coarse rows of sin and cos
    return cached + split


def test_the_file_holds_each_table_once(converted, tmp_path):
    # Tables 60x the weights: a copy per use would show at once.
    model, path = converted["rotary_encoder"]
    parameters = sum(int(np.prod(w.shape)) * 4 for w in model.weights)
    assert path.stat().st_size <= 1.2 * (parameters + _table_bytes(4, rotary=True))
    # A learned encoder of the default size: its weights alone.
    learned = build_encoder(DEFAULT_ENCODERS["learned"])
    path = kpe.save_litert(learned, tmp_path / "learned.tflite")
    parameters = sum(int(np.prod(w.shape)) * 4 for w in learned.weights)
    assert path.stat().st_size <= 1.2 * parameters


def test_without_ai_edge_litert_the_tensorflow_interpreter_runs_it(converted, monkeypatch):
    import builtins

    import tensorflow as tf

    real_import = builtins.__import__

    def no_litert(name, *args, **kwargs):
        if name.startswith("ai_edge_litert"):
            raise ImportError("No module named 'ai_edge_litert'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_litert)
    model, path = converted["learned"]
    assert isinstance(kpe.litert_interpreter(path), tf.lite.Interpreter)
    report = kpe.verify_export(model, litert_path=path, **GRID)
    assert report["passed"], report["summary"]
