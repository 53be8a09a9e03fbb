"""What the teacher-forced case adds to `save_decoder`'s verification, in seconds.

Per case of `check.verify_decoder` (the greedy cases, then the teacher-forced prompt of
`max_length` tokens), the reference (Keras's step model, `keras_greedy`), onnxruntime
(the GroupQueryAttention file, `onnx_greedy`) and the comparison, timed once each after
one warm-up run of every case; and the float64 decode of the description (`exact.py`),
which verification runs only where a runtime fails against the reference or the
decoder has a mixture of experts. Sizes: the tests' tiny decoder (width 32, 2 layers,
128 slots) and `decode_floor.py`'s 512x8 (25M parameters, 1024 slots).

Run: `PYTHONPATH=. python -m benchmarks.verify_positions`.
"""

from __future__ import annotations

import time


def _tiny():
    import keras

    from keras_posenc import DecoderBlock, decoder_models

    keras.utils.set_random_seed(0)
    blocks = [DecoderBlock(16, 4, 2, 48, name=f"b{i}") for i in range(2)]
    embedding = keras.layers.Embedding(40, 32, embeddings_initializer="normal")
    head = keras.layers.Dense(40, use_bias=False)
    return decoder_models(embedding, blocks, keras.layers.RMSNormalization(), head, 128)[1], 128


def _large():
    from benchmarks.decode_floor import MAX_LENGTH, SIZES, step_model

    return step_model(SIZES["512x8"]), MAX_LENGTH


def run(sizes=("tiny", "512x8")) -> list[dict]:
    import onnxruntime

    from keras_posenc.export.decoder import check, decoder_onnx, describe_decoder
    from keras_posenc.export.decoder.exact import exact_greedy
    from keras_posenc.export.decoder.greedy_generation import keras_greedy, onnx_greedy

    rows = []
    for name in sizes:
        model, max_length = _tiny() if name == "tiny" else _large()
        decoder = describe_decoder(model, max_length)
        session = onnxruntime.InferenceSession(
            decoder_onnx(decoder).SerializeToString(), providers=["CPUExecutionProvider"]
        )
        cases = check.decoder_cases(decoder.vocabulary, max_length)
        cases.append(check.teacher_forced_case(decoder.vocabulary, max_length))
        for warm in (True, False):
            for case in cases:
                args = case["prompts"], case["mask"], case["steps"]
                times = [time.perf_counter()]
                expected = keras_greedy(model, *args)
                times.append(time.perf_counter())
                got = onnx_greedy(session, *args, max_length)
                times.append(time.perf_counter())
                check.compare_greedy(expected, got, case["mask"])
                times.append(time.perf_counter())
                exact_greedy(decoder, case["prompts"], case["mask"], expected[0])
                times.append(time.perf_counter())
                if warm:
                    continue
                parts = ("keras", "onnxruntime", "compare", "float64")
                row = {"size": name, "case": case["name"]}
                intervals = zip(parts, times[:-1], times[1:], strict=True)
                row.update({p: round(b - a, 3) for p, a, b in intervals})
                rows.append(row)
                print(row, flush=True)
    return rows


if __name__ == "__main__":
    run()
