"""The exported decode step in onnxruntime against the genai model builder's graph (issue 24).

Two Llama-style sizes (width 256, 4 layers, 8 query / 2 key-value heads of 32, and width
512, 8 layers, heads of 64; SwiGLU, vocabulary 1024, cache 1024), batch 1 and 4, one
token per row at positions ~100 and ~900. `save_decoder`'s graph (`keras_posenc`), its
standard-op graph (`standard`: `attention="standard"`) and the reference graph of
`gqa_reference.py`, both made from the same `Decoder` description, run in one process,
interleaved in a random order per round, `intra_op_num_threads=1`, each through IOBinding
with one buffer per layer bound as past and present.
"""

from __future__ import annotations

import random
import statistics
import time

import numpy as np

SIZES = {
    "256x4": {"width": 256, "layers": 4, "head_dim": 32, "ffn": 768},
    "512x8": {"width": 512, "layers": 8, "head_dim": 64, "ffn": 1536},
}
VOCABULARY, MAX_LENGTH, QUERY_HEADS, KV_HEADS = 1024, 1024, 8, 2


def step_model(size: dict):
    import keras

    from keras_posenc import DecoderBlock, decoder_models

    blocks = [
        DecoderBlock(
            size["head_dim"], QUERY_HEADS, KV_HEADS, size["ffn"], rope_max_wavelength=500000.0
        )
        for _ in range(size["layers"])
    ]
    return decoder_models(
        keras.layers.Embedding(VOCABULARY, size["width"]),
        blocks,
        keras.layers.RMSNormalization(),
        keras.layers.Dense(VOCABULARY),
        max_length=MAX_LENGTH,
    )[1]


def _session(model):
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    return onnxruntime.InferenceSession(
        model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )


class Bound:
    """A session with its inputs and shared cache buffers bound once, for one position."""

    def __init__(self, session, batch: int, position: int, kv_shape):
        import onnxruntime

        self.session, self.binding = session, session.io_binding()
        rng = np.random.default_rng(0)
        self.ids = np.zeros((batch, 1), np.int64)
        self.mask = np.ones((batch, position + 1), np.int64)
        self.binding.bind_cpu_input("input_ids", self.ids)
        self.binding.bind_cpu_input("attention_mask", self.mask)
        self.buffers = []
        for value in session.get_inputs()[2:]:
            cache = rng.normal(size=(batch, *kv_shape)).astype(np.float32)
            buffer = onnxruntime.OrtValue.ortvalue_from_numpy(cache)
            self.buffers.append(buffer)
            self.binding.bind_ortvalue_input(value.name, buffer)
            self.binding.bind_ortvalue_output(
                value.name.replace("past_key_values", "present"), buffer
            )
        logits = onnxruntime.OrtValue.ortvalue_from_numpy(
            np.zeros((batch, 1, VOCABULARY), np.float32)
        )
        self.binding.bind_ortvalue_output("logits", logits)
        self.logits = logits

    def __call__(self) -> float:
        start = time.perf_counter()
        self.session.run_with_iobinding(self.binding)
        return time.perf_counter() - start


def compare(name: str, batch: int, position: int, sessions: dict, kv_shape, rounds: int) -> dict:
    bound = {kind: Bound(session, batch, position, kv_shape) for kind, session in sessions.items()}
    for call in bound.values():
        call(), call()  # warm up
    times = {kind: [] for kind in bound}
    rng = random.Random(position * 10 + batch)
    for _ in range(rounds):
        for kind in rng.sample(list(bound), len(bound)):
            times[kind].append(bound[kind]())
    medians = {kind: 1000 * statistics.median(t) for kind, t in times.items()}
    theirs = bound["reference"].logits.numpy()
    differences = {
        f"{kind}_diff": float(np.abs(bound[kind].logits.numpy() - theirs).max())
        for kind in bound
        if kind != "reference"
    }
    return {"size": name, "batch": batch, "position": position, **medians, **differences}


def run(rounds: int = 40, sizes=tuple(SIZES)) -> list[dict]:
    import keras

    from benchmarks.gqa_reference import reference_graph
    from keras_posenc.export.decoder import decoder_onnx, describe_decoder

    rows = []
    for name in sizes:
        keras.utils.set_random_seed(0)
        size = SIZES[name]
        decoder = describe_decoder(step_model(size), MAX_LENGTH)
        sessions = {
            "keras_posenc": _session(decoder_onnx(decoder)),
            "reference": _session(reference_graph(decoder)),
            "standard": _session(decoder_onnx(decoder, "standard")),
        }
        kv_shape = (KV_HEADS, MAX_LENGTH, size["head_dim"])
        for batch in (1, 4):
            for position in (100, 900):
                rows.append(compare(name, batch, position, sessions, kv_shape, rounds))
                row = rows[-1]
                ours, gqa, standard = (row[k] for k in ("keras_posenc", "reference", "standard"))
                print(
                    f"| {name} | {batch} | {position} | {ours:.3f} | {gqa:.3f} | "
                    f"{ours / gqa:.3f} | {row['keras_posenc_diff']:.1e} | {standard:.3f} | "
                    f"{standard / gqa:.2f} | {row['standard_diff']:.1e} |",
                    flush=True,
                )
    return rows


def main(rounds: int = 40) -> list[dict]:
    columns = (
        "keras_posenc (ms) | reference GQA (ms) | ratio | max logit diff | "
        "standard (ms) | standard / GQA | its max logit diff"
    )
    print(f"| size | batch | position | {columns} |")
    print("| --- " * 10 + "|")
    return run(rounds)
