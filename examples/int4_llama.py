"""The tiny Llama of `tiny_llama.py`, written as int4 and generating through `og.Generator`.

The decoder trains as in `tiny_llama.py` (continue a periodic sequence), then
`save_decoder(..., quantize="int4")` writes onnxruntime-genai's folder with every
projection and the head as `MatMulNBits` (4 bits, blocks of 32, `accuracy_level` 4: the
genai builder's `-p int4 -e cpu` settings) and verifies it against the Keras model with
each weight replaced by what the file stores (docs/quantization.md). onnxruntime-genai's
`og.Generator` then continues each prompt, and onnxruntime alone continues the same prompts
left-padded in one batch, as onnxruntime-genai's interface feeds them.

Run it:

    python examples/int4_llama.py           # a few seconds of training, 48 new tokens
    python examples/int4_llama.py --tiny    # smaller and shorter (also KERAS_POSENC_EXAMPLE_TINY=1)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # tiny_llama.py, beside this file
import tiny_llama  # noqa: E402


def onnx_bytes(folder: Path) -> int:
    """The bytes of a folder's ONNX graph and its external data."""
    return sum(p.stat().st_size for p in folder.iterdir() if ".onnx" in p.name)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--tiny",
        action="store_true",
        default=os.environ.get(tiny_llama.TINY_ENVIRONMENT_VARIABLE, "") not in ("", "0"),
        help=f"a smaller decoder, trained briefly (also {tiny_llama.TINY_ENVIRONMENT_VARIABLE}=1)",
    )
    args = parser.parse_args(argv)
    os.environ.setdefault("KERAS_BACKEND", "tensorflow")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras

    from keras_posenc.export import save_decoder

    size = tiny_llama.TINY if args.tiny else tiny_llama.FULL
    keras.utils.set_random_seed(0)
    train_model, step_model = tiny_llama.build_decoder(size)
    tiny_llama.train(train_model, size)
    prompts, mask = tiny_llama.left_padded_prompts(np.random.default_rng(1), size)
    expected = np.stack(
        [
            tiny_llama.periodic_continuation(p[m.astype(bool)], size.new_tokens)
            for p, m in zip(prompts, mask, strict=True)
        ]
    )
    with tempfile.TemporaryDirectory() as folder:
        folder = Path(folder)
        report = save_decoder(
            step_model, folder / "int4", max_length=size.max_length, quantize="int4", verbose=0
        )
        # onnxruntime alone, the prompts left-padded in one batch (tiny_llama's loop).
        arrays = folder / "arrays.npz"
        np.savez(arrays, prompts=prompts, mask=mask, size=json.dumps(dataclasses.asdict(size)))
        tiny_llama.onnx_generation(folder / "int4", arrays, folder / "onnx.npz")
        onnx_tokens = np.load(folder / "onnx.npz")["tokens"]
        genai_tokens = tiny_llama.genai_generation(folder / "int4", prompts, mask, size.new_tokens)
        int4_bytes = onnx_bytes(folder / "int4")
    float32_bytes = sum(4 * int(np.prod(w.shape)) for w in step_model.weights)
    results = {
        "verified": {
            runtime: all(case["runtimes"][runtime]["passed"] for case in report["cases"])
            for runtime in report["cases"][0]["runtimes"]
        },
        "int4_bytes": int4_bytes,
        "float32_weight_bytes": float32_bytes,
        "onnx_tokens": onnx_tokens,
        "genai_tokens": genai_tokens,
        "onnx_accuracy": float(np.mean(onnx_tokens == expected)),
    }
    print(f"int4 file: {int4_bytes} bytes (the float32 weights: {float32_bytes} bytes)")
    print(f"save_decoder's verification: {results['verified']}")
    print(f"onnxruntime, left-padded batch: right {results['onnx_accuracy']:.0%} of the tokens")
    if genai_tokens is None:
        print("onnxruntime-genai: not installed")
    else:
        same = bool(np.array_equal(genai_tokens, onnx_tokens))
        print(f"og.Generator, one prompt at a time: {genai_tokens[0][:8]}...; same tokens: {same}")
    return results


if __name__ == "__main__":
    main()
