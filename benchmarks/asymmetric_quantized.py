"""Symmetric vs asymmetric int4 (`save_decoder(symmetric=False)`): bytes and agreement.

One random-weight transformers Llama (`quantized_decode.SIZES["21M"]`, untied, saved by
`quantized_decode.llama_folder`) loaded into keras_hub and written by `save_decoder(quantize=
"int4")` twice, `symmetric` True and False, verified (the verification's report gives, per
case, the file's teacher-forced agreement with the float32 model over the prompts: top-1
share and logit RMS; here their means over the cases). Beside them the genai builder's
`-p int4 -e cpu` files of the same folder, symmetric and `--extra_options
is_symmetric=false` (onnxruntime-genai 0.18's name; older builders: `int4_is_symmetric`):
their bytes, and how many of our MatMulNBits initializers (packed weights, scales, zero
points) are byte for byte one of the builder's. No timing.

    python -m benchmarks.asymmetric_quantized [--work DIR]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from benchmarks.quantized_decode import MAX_LENGTH, matmul_settings, onnx_bytes


def _builder(hf: Path, out: Path, symmetric: bool) -> None:
    command = [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(hf)]
    command += ["-o", str(out), "-p", "int4", "-e", "cpu", "-c", str(out) + ".cache"]
    if not symmetric:
        command += ["--extra_options", "is_symmetric=false"]
    subprocess.run(command, check=True, capture_output=True)


def _ours(hf: Path, out: Path, symmetric: bool, settings: dict) -> dict:
    import keras_hub

    from keras_posenc.export import save_decoder

    causal_lm = keras_hub.models.LlamaCausalLM.from_preset(
        str(hf), dtype="float32", preprocessor=None
    )
    report = save_decoder(
        causal_lm,
        out,
        max_length=MAX_LENGTH,
        quantize="int4",
        block_size=settings["block_size"],
        accuracy_level=settings["accuracy_level"],
        symmetric=symmetric,
        verbose=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    agreements = [c["runtimes"]["onnxruntime"]["against_float32"] for c in report["cases"]]
    return {
        "passed": report["passed"],
        "top1_agreement": float(np.mean([a["top1_agreement"] for a in agreements])),
        "logit_rms_difference": float(np.mean([a["logit_rms_difference"] for a in agreements])),
    }


def _nbits_initializers(folder: Path) -> dict:
    """`{input position: set of content digests}` of the MatMulNBits nodes' initializers
    (1 packed weights, 2 scales, 3 zero points)."""
    import onnx
    from onnx import numpy_helper

    path = next(p for p in folder.iterdir() if p.suffix == ".onnx")
    model = onnx.load(str(path))
    arrays = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    found = {1: set(), 2: set(), 3: set()}
    for node in model.graph.node:
        if node.op_type == "MatMulNBits":
            for position in found:
                if len(node.input) > position and node.input[position] in arrays:
                    array = np.ascontiguousarray(arrays[node.input[position]])
                    digest = hashlib.sha256(array.tobytes() + str(array.shape).encode())
                    found[position].add(digest.hexdigest())
    return found


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, default=None)
    args = parser.parse_args(argv)
    os.environ.setdefault("KERAS_BACKEND", "tensorflow")
    work = args.work or Path(tempfile.mkdtemp(prefix="asymmetric_"))
    hf = work / "hf"
    if not hf.exists():  # torch in a process of its own
        code = f"from benchmarks.quantized_decode import llama_folder; llama_folder({str(hf)!r})"
        subprocess.run([sys.executable, "-c", code], check=True)
    results = {}
    for symmetric in (True, False):
        name = "symmetric" if symmetric else "asymmetric"
        _builder(hf, work / f"builder_{name}", symmetric)
        settings = matmul_settings(work / f"builder_{name}")
        ours = _ours(hf, work / f"ours_{name}", symmetric, settings)
        theirs, mine = (_nbits_initializers(work / f"{w}_{name}") for w in ("builder", "ours"))
        same = {p: f"{len(mine[p] & theirs[p])}/{len(mine[p])}" for p in mine if mine[p]}
        results[name] = {
            **ours,
            "settings": settings,
            "ours_bytes": onnx_bytes(work / f"ours_{name}"),
            "builder_bytes": onnx_bytes(work / f"builder_{name}"),
            "ours_in_builders (weights, scales, zero points)": same,
        }
        print(name, json.dumps(results[name]), flush=True)
    return results


if __name__ == "__main__":
    main()
