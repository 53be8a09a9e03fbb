"""Prefill and decode tokens/s of a `.litertlm` bundle in LiteRT-LM's engine (its own
benchmark, `litert_lm.Benchmark`, what `litert-lm benchmark` runs), against litert-torch's
`export_hf --bundle_litert_lm` bundle of the same weights (`--baseline`), or else against
the same `.tflite` decode signature in the LiteRT interpreter.

The model: a small random keras_hub Llama (8 layers, width 512, 8 query / 2 key-value
heads, MLP 1536) with the tiny SentencePiece tokenizer of the tests; with `--hf-folder`,
the backbone of a transformers Llama saved there (the weights litert-torch exports).
`max_length` 320, no verification (the tests verify the bundle's text). Rounds
interleave ours and the baseline; medians and the median of the per-round ratios are
printed with the load average:

    KERAS_BACKEND=tensorflow python -m benchmarks.litertlm_decode [--rounds 3] \
        [--hf-folder hf_llama --baseline lt_out/model.litertlm [--ours ours/model.litertlm]]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

PREFILL, DECODE, MAX_LENGTH = 128, 128, 320
SHAPE = dict(num_layers=8, num_query_heads=8, num_key_value_heads=2, hidden_dim=512)


def small_llama(hf_folder: str | None = None):
    """The Llama of the module docstring with the tests' SentencePiece tokenizer."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    import keras_hub
    from keras_hub_models import redraw
    from tiny_sentencepiece import sentencepiece_proto

    tokenizer = keras_hub.models.LlamaTokenizer(proto=sentencepiece_proto())
    if hf_folder:  # the backbone only: keras_hub reads its tokenizer.json as Llama 3's
        backbone = keras_hub.models.LlamaBackbone.from_preset(hf_folder, dtype="float32")
    else:
        backbone = keras_hub.models.LlamaBackbone(
            vocabulary_size=tokenizer.vocabulary_size(), intermediate_dim=1536, **SHAPE
        )
        redraw(backbone, 0)
    preprocessor = keras_hub.models.LlamaCausalLMPreprocessor(tokenizer, sequence_length=64)
    return keras_hub.models.LlamaCausalLM(backbone=backbone, preprocessor=preprocessor)


def engine_rates(bundle: Path, cache: str) -> tuple[float, float]:
    """`(prefill, decode)` tokens/s of LiteRT-LM's benchmark on the CPU."""
    import litert_lm

    benchmark = litert_lm.Benchmark(
        str(bundle),
        litert_lm.Backend.CPU(),
        prefill_tokens=PREFILL,
        decode_tokens=DECODE,
        max_num_tokens=MAX_LENGTH,
        cache_dir=cache,
    )
    info = benchmark.run()
    return float(info.last_prefill_tokens_per_second), float(info.last_decode_tokens_per_second)


def interpreter_decode_rate(tflite: bytes) -> float:
    """Decode tokens/s of the file's `decode` signature in the LiteRT interpreter: `DECODE`
    steps after `PREFILL` cached positions, the caches fed back (numpy), as an engine
    without its own loop would run it."""
    from keras_posenc.export.decoder.litert_runner import causal_mask
    from keras_posenc.export.litert import litert_interpreter

    runner = litert_interpreter(tflite).get_signature_runner("decode")
    details = runner.get_input_details()
    caches = {
        name: np.zeros(d["shape"], np.float32)
        for name, d in details.items()
        if name.startswith("kv_cache_")
    }
    slots = details["mask"]["shape"][-1]
    padding = np.ones((1, slots), np.int32)
    token = np.array([[5]], np.int32)
    start = time.perf_counter()
    for position in range(PREFILL, PREFILL + DECODE):
        input_pos = np.array([position], np.int32)
        out = runner(
            tokens=token, input_pos=input_pos, mask=causal_mask(padding, input_pos), **caches
        )
        caches = {name: out[name] for name in caches if name in out} or caches
        token = np.argmax(out["logits"][:, -1], axis=-1).astype(np.int32)[:, None]
    return DECODE / (time.perf_counter() - start)


def main(argv=None) -> dict:
    from keras_posenc.export import save_decoder
    from keras_posenc.export.decoder.litertlm_model import decoder_litertlm_tflite

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--hf-folder", help="a transformers Llama's folder (its weights)")
    parser.add_argument("--baseline", help="litert-torch's model.litertlm of those weights")
    parser.add_argument("--ours", help="our model.litertlm of them, written before")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as folder:
        bundle, tflite = Path(args.ours or Path(folder) / "bundle" / "model.litertlm"), None
        if not args.ours or not args.baseline:
            causal_lm = small_llama(args.hf_folder)
        if not args.ours:
            save_decoder(
                causal_lm,
                bundle.parent,
                max_length=MAX_LENGTH,
                formats=("litertlm",),
                verify=False,
                verbose=0,
            )
        if not args.baseline:
            from keras_posenc import keras_hub as bridge

            decoder = bridge.describe_causal_lm(causal_lm, MAX_LENGTH + 32)
            tflite = decoder_litertlm_tflite(decoder)
        rows = []
        for _ in range(args.rounds):
            prefill, decode = engine_rates(bundle, folder)
            if args.baseline:
                base_prefill, base_decode = engine_rates(Path(args.baseline), folder)
            else:
                base_prefill, base_decode = float("nan"), interpreter_decode_rate(tflite)
            rows.append((prefill, decode, base_prefill, base_decode))
            print(
                f"ours prefill {prefill:.1f} decode {decode:.1f}; baseline prefill "
                f"{base_prefill:.1f} decode {base_decode:.1f} tok/s",
                flush=True,
            )
        result = {
            "bundle_bytes": bundle.stat().st_size,
            "baseline": args.baseline or "the decode signature in the LiteRT interpreter",
            "baseline_bytes": Path(args.baseline).stat().st_size if args.baseline else None,
            "prefill_tokens_per_s": statistics.median(r[0] for r in rows),
            "decode_tokens_per_s": statistics.median(r[1] for r in rows),
            "baseline_prefill_tokens_per_s": statistics.median(r[2] for r in rows),
            "baseline_decode_tokens_per_s": statistics.median(r[3] for r in rows),
            "decode_ratio": statistics.median(r[1] / r[3] for r in rows),
            "prefill_ratio": statistics.median(r[0] / r[2] for r in rows),
            "loadavg": open("/proc/loadavg").read().split()[:3],
        }
        print(result)
        return result


if __name__ == "__main__":
    os.environ.setdefault("KERAS_BACKEND", "tensorflow")
    main()
