"""Bytes of each exported file against parameters + tables, and against the model without positions.

For each model: the parameters and one copy of each reachable position table (what a file
cannot do without), the SavedModel, ONNX and LiteRT files written by `save_*`, and the same
files of its twin without position information (the same blocks with plain
`MultiHeadAttention`, no position layer). The twin's graph is what TensorFlow, Keras and the
converters spend on that architecture whatever the positions; "ours" is what is left of a
file after the parameters, the tables and that graph:

    python -m benchmarks.sizes            # the default encoders, bounded ones, RoPE stacks
    python -m benchmarks.sizes --json sizes.json
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import keras

from keras_posenc import RotaryMultiHeadAttention
from keras_posenc import export as kpe
from keras_posenc_cli import encoders

FORMATS = ("saved_model", "onnx", "litert")


def stacked(layers: int, rotary: bool) -> keras.Model:
    """`layers` attention layers of 2 heads of 16 on width 16 with residuals (one 4096 x 16
    RoPE table, 10x the weights of 12 layers): `stacked_rotary` of the tests."""
    states = keras.Input((None, 16), name="states")
    hidden = states
    for index in range(layers):
        kind = RotaryMultiHeadAttention if rotary else keras.layers.MultiHeadAttention
        hidden = hidden + kind(num_heads=2, key_dim=16, name=f"attention_{index}")(hidden, hidden)
    model = keras.Model(states, {"encoded": hidden}, name="stacked")
    encoders.seed_weights(model, 7)
    return model


def _without_positions(spec: encoders.EncoderSpec) -> keras.Model:
    """The encoder of `spec` with plain attention and no position layer."""
    token_ids = keras.Input(shape=(None,), dtype="int32", name="token_ids")
    hidden = keras.layers.Embedding(spec.vocabulary_size, spec.width, name="token_embedding")(
        token_ids
    )
    for index in range(spec.num_blocks):
        block = encoders.EncoderBlock(
            spec.num_heads, spec.feed_forward_dim, rotary=False, name=f"block_{index}"
        )
        hidden = block(hidden)
    encoded = keras.layers.LayerNormalization(epsilon=1e-5, name="final_norm")(hidden)
    model = keras.Model({"token_ids": token_ids}, {"encoded": encoded})
    encoders.seed_weights(model, spec.seed)
    return model


def models() -> dict[str, tuple[keras.Model, keras.Model, int | None]]:
    """name -> (model, its twin without positions, max_sequence_length)."""
    cases = {}
    for name, spec in encoders.DEFAULT_ENCODERS.items():
        cases[name] = (encoders.build_encoder(spec), _without_positions(spec), None)
    for name in ("sinusoidal", "rotary"):
        spec = encoders.DEFAULT_ENCODERS[name]
        cases[f"{name}, bound 512"] = (
            encoders.build_encoder(spec),
            _without_positions(spec),
            512,
        )
    for layers in (4, 12):
        cases[f"{layers} RoPE layers"] = (stacked(layers, True), stacked(layers, False), None)
    return cases


def file_bytes(model: keras.Model, folder: Path, bound: int | None) -> dict[str, int]:
    folder.mkdir()
    written = {
        "saved_model": kpe.save_saved_model(
            model, folder / "saved_model", max_sequence_length=bound
        ),
        "onnx": kpe.save_onnx(model, folder / "model.onnx", max_sequence_length=bound),
        "litert": kpe.save_litert(model, folder / "model.tflite", max_sequence_length=bound),
    }
    return {
        kind: sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
        if path.is_dir()
        else path.stat().st_size
        for kind, path in written.items()
    }


def measure(name: str, model, twin, bound) -> dict:
    parameters = kpe.parameter_bytes(model)
    tables = kpe.position_table_bytes(model, bound)
    with tempfile.TemporaryDirectory() as folder:
        sizes = file_bytes(model, Path(folder) / "model", bound)
        twin_sizes = file_bytes(twin, Path(folder) / "twin", None)
    twin_parameters = kpe.parameter_bytes(twin)
    row = {"model": name, "parameter_bytes": parameters, "table_bytes": tables}
    for kind in FORMATS:
        floor = twin_sizes[kind] - twin_parameters  # the twin's graph
        row[kind] = {
            "bytes": sizes[kind],
            "ratio": sizes[kind] / (parameters + tables),
            "twin_graph_bytes": floor,
            "ours_bytes": sizes[kind] - parameters - tables - floor,
        }
    return row


def markdown(rows: list[dict]) -> str:
    lines = [
        "| model | parameters + tables (B) | "
        + " | ".join(f"{kind}: bytes (ratio) | twin's graph | ours" for kind in FORMATS)
        + " |",
        "|---|--:|" + "--:|--:|--:|" * len(FORMATS),
    ]
    for row in rows:
        cells = [row["model"], f"{row['parameter_bytes'] + row['table_bytes']:,}"]
        for kind in FORMATS:
            entry = row[kind]
            cells += [
                f"{entry['bytes']:,} ({entry['ratio']:.2f}x)",
                f"{entry['twin_graph_bytes']:,}",
                f"{entry['ours_bytes']:,}",
            ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.sizes", description=__doc__)
    parser.add_argument("--json", type=Path, default=None, help="also write the rows here")
    parser.add_argument("--only", default=None, help="models whose name contains this")
    args = parser.parse_args(argv)
    rows = []
    for name, (model, twin, bound) in models().items():
        if args.only and args.only not in name:
            continue
        rows.append(measure(name, model, twin, bound))
        print(f"measured {name}", flush=True)
    print(markdown(rows))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return rows


if __name__ == "__main__":
    main()
