"""Export a rotary Transformer encoder to ONNX, then serve it with onnxruntime alone.

Two halves, kept apart on purpose:

- `export_encoder` (TensorFlow, Keras, keras_posenc) builds the encoder, writes
  `encoder.onnx` with `keras_posenc.export.save_onnx`, the Keras model as `encoder.keras`,
  and `expected.npz`: a few requests with the Keras outputs to check the server against;
- `EncoderServer` (numpy and onnxruntime only) answers single requests and batches.

Run without a command, the script exports in a child process and serves in its own, so the
serving process never imports TensorFlow (it checks that it did not):

    python examples/serve_onnx.py                  # export + serve, files in a temporary folder
    python examples/serve_onnx.py --out encoder    # keep the files in ./encoder
    python examples/serve_onnx.py export --out encoder
    python examples/serve_onnx.py serve --out encoder
    python examples/serve_onnx.py --tiny           # small (or KERAS_POSENC_EXAMPLE_TINY=1)
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnxruntime

TINY_ENVIRONMENT_VARIABLE = "KERAS_POSENC_EXAMPLE_TINY"
MODEL_FILE = "encoder.onnx"
KERAS_FILE = "encoder.keras"
EXPECTED_FILE = "expected.npz"
REQUEST_LENGTHS = (1, 3, 17, 17, 40, 3, 128)


# --------------------------------------------------------------------------------------
# Serving: numpy and onnxruntime only.


class EncoderServer:
    """Encodes token id sequences with an ONNX encoder in onnxruntime.

    Example:

    >>> server = EncoderServer("encoder/encoder.onnx")
    >>> server.encode([5, 17, 3]).shape
    (3, 64)
    >>> [e.shape for e in server.encode_batch([[5, 17, 3], [8], [1, 2, 3]])]
    [(3, 64), (1, 64), (3, 64)]

    Args:
        model_path: the `.onnx` file, input `(batch, sequence)` int32 token ids, output
            `(batch, sequence, width)`.
        threads: onnxruntime's intra-op threads (default: its own choice).
    """

    def __init__(self, model_path: str | os.PathLike, threads: int | None = None):
        options = onnxruntime.SessionOptions()
        if threads is not None:
            options.intra_op_num_threads = threads
        self.session = onnxruntime.InferenceSession(
            str(model_path), options, providers=["CPUExecutionProvider"]
        )
        (model_input,) = self.session.get_inputs()
        self.input_name = model_input.name
        self.output_name = self.session.get_outputs()[0].name

    @staticmethod
    def _checked(token_ids: Sequence[int]) -> np.ndarray:
        request = np.asarray(token_ids)
        if request.ndim != 1 or request.size == 0:
            raise ValueError(
                f"A request is a non-empty list of token ids, got shape {request.shape}."
            )
        if not np.issubdtype(request.dtype, np.integer):
            raise TypeError(f"Token ids must be integers, got dtype {request.dtype}.")
        if request.min() < 0:
            # onnxruntime's Gather would read negative ids from the end of the table.
            raise ValueError(f"Token ids must be >= 0, got {int(request.min())}.")
        return request.astype(np.int32)

    def encode(self, token_ids: Sequence[int]) -> np.ndarray:
        """One request: `(sequence,)` token ids -> `(sequence, width)` encodings."""
        request = self._checked(token_ids)[None]
        return self.session.run([self.output_name], {self.input_name: request})[0][0]

    def encode_batch(self, requests: Sequence[Sequence[int]]) -> list[np.ndarray]:
        """Many requests, one onnxruntime call per distinct length.

        Requests of equal length go through together. Requests are not padded to one
        length: the encoder has no padding mask, so its attention would read the padding
        and change the answers.
        """
        checked = [self._checked(request) for request in requests]
        answers: list[np.ndarray | None] = [None] * len(checked)
        for length in sorted({len(request) for request in checked}):
            indices = [i for i, request in enumerate(checked) if len(request) == length]
            batch = np.stack([checked[i] for i in indices])
            encoded = self.session.run([self.output_name], {self.input_name: batch})[0]
            for row, i in enumerate(indices):
                answers[i] = encoded[row]
        return answers


def serve(folder: Path, repeats: int = 20) -> dict[str, float]:
    """Answers the requests in `expected.npz` singly and as one batch, checks them, times them.

    Returns:
        The max abs difference from Keras of the single and the batched answers, and the
        median milliseconds to answer all requests each way.
    """
    expected = np.load(folder / EXPECTED_FILE)
    count = len([name for name in expected.files if name.startswith("request_")])
    requests = [expected[f"request_{i}"] for i in range(count)]
    keras_outputs = [expected[f"encoded_{i}"] for i in range(count)]
    server = EncoderServer(folder / MODEL_FILE)

    single = [server.encode(request) for request in requests]
    batched = server.encode_batch(requests)
    timings = {"single": [], "batched": []}
    for _ in range(repeats):
        start = time.perf_counter()
        for request in requests:
            server.encode(request)
        timings["single"].append(time.perf_counter() - start)
        start = time.perf_counter()
        server.encode_batch(requests)
        timings["batched"].append(time.perf_counter() - start)

    def max_difference(answers):
        return max(
            float(np.max(np.abs(a - e))) for a, e in zip(answers, keras_outputs, strict=True)
        )

    return {
        "single_max_abs_difference": max_difference(single),
        "batched_max_abs_difference": max_difference(batched),
        "single_ms": 1e3 * statistics.median(timings["single"]),
        "batched_ms": 1e3 * statistics.median(timings["batched"]),
    }


# --------------------------------------------------------------------------------------
# Export: TensorFlow, Keras and keras_posenc, imported inside the functions that use them.


def build_encoder(tiny: bool = False):
    """A Transformer encoder with rotary attention: token ids -> encodings `(b, s, width)`."""
    os.environ.setdefault("KERAS_BACKEND", "tensorflow")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras

    from keras_posenc import RotaryMultiHeadAttention

    vocabulary_size, width, num_heads, blocks = (100, 16, 2, 1) if tiny else (1000, 64, 4, 2)
    token_ids = keras.Input((None,), dtype="int32", name="token_ids")
    x = keras.layers.Embedding(vocabulary_size, width, name="token_embedding")(token_ids)
    for block in range(blocks):
        attended = RotaryMultiHeadAttention(
            num_heads, width // num_heads, name=f"block_{block}_attention"
        )(x, x)
        x = keras.layers.LayerNormalization(name=f"block_{block}_attention_norm")(x + attended)
        # silu rather than gelu: Keras's exact gelu needs Erfc, which tf2onnx cannot convert.
        hidden = keras.layers.Dense(4 * width, activation="silu", name=f"block_{block}_in")(x)
        hidden = keras.layers.Dense(width, name=f"block_{block}_out")(hidden)
        x = keras.layers.LayerNormalization(name=f"block_{block}_norm")(x + hidden)
    return keras.Model(token_ids, keras.layers.Identity(name="encoded")(x), name="encoder")


def export_encoder(folder: Path, tiny: bool = False, seed: int = 0):
    """Builds the encoder and writes `encoder.onnx`, `encoder.keras` and `expected.npz`.

    Returns:
        The Keras model.
    """
    os.environ.setdefault("KERAS_BACKEND", "tensorflow")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras

    from keras_posenc.export import save_onnx, whole_or_nothing

    keras.utils.set_random_seed(seed)
    model = build_encoder(tiny)
    folder.mkdir(parents=True, exist_ok=True)
    save_onnx(model, folder / MODEL_FILE)
    model.save(folder / KERAS_FILE)

    rng = np.random.default_rng(seed)
    vocabulary_size = model.get_layer("token_embedding").input_dim
    arrays = {}
    for i, length in enumerate(REQUEST_LENGTHS):
        request = rng.integers(0, vocabulary_size, length, dtype=np.int32)
        arrays[f"request_{i}"] = request
        arrays[f"encoded_{i}"] = np.asarray(model(request[None]))[0]
    with whole_or_nothing(folder / EXPECTED_FILE) as written:
        with open(written, "wb") as file:
            np.savez(file, **arrays)
    return model


# --------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> dict[str, float] | None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", nargs="?", choices=("export", "serve"), help="one half only")
    parser.add_argument("--out", type=Path, help="folder of the exported files")
    parser.add_argument(
        "--tiny",
        action="store_true",
        default=os.environ.get(TINY_ENVIRONMENT_VARIABLE, "") not in ("", "0"),
        help=f"a small encoder (also {TINY_ENVIRONMENT_VARIABLE}=1)",
    )
    args = parser.parse_args(argv)
    if args.command and args.out is None:
        parser.error(f"{args.command} needs --out FOLDER")

    if args.command == "export":
        export_encoder(args.out, tiny=args.tiny)
        print(f"wrote {args.out / MODEL_FILE}, {args.out / KERAS_FILE}, {args.out / EXPECTED_FILE}")
        return None

    with tempfile.TemporaryDirectory() as temporary:
        folder = args.out or Path(temporary)
        if args.command is None:
            # The export runs in a child process: TensorFlow never enters this one.
            export = [sys.executable, __file__, "export", "--out", str(folder)]
            subprocess.run(export + (["--tiny"] if args.tiny else []), check=True)
        results = serve(folder)

    print(f"{len(REQUEST_LENGTHS)} requests of lengths {REQUEST_LENGTHS}, onnxruntime only:")
    for way in ("single", "batched"):
        print(
            f"  {way:<8} max |onnxruntime - keras| = {results[f'{way}_max_abs_difference']:.1e}, "
            f"{results[f'{way}_ms']:.2f} ms for all requests (median)"
        )
    loaded = sorted(name for name in ("tensorflow", "keras", "keras_posenc") if name in sys.modules)
    print(f"  modules of TensorFlow/Keras imported by the server: {loaded or 'none'}")
    if loaded:
        raise RuntimeError(f"The serving process imported {loaded}; it must need onnxruntime only.")
    worst = max(results["single_max_abs_difference"], results["batched_max_abs_difference"])
    if worst > 1e-5:
        raise RuntimeError(f"onnxruntime differs from Keras by {worst:.2e} (more than 1e-5).")
    return results


if __name__ == "__main__":
    main()
