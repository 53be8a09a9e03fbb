"""`python -m benchmarks.keras_quantized_agreement`: Keras-quantized CausalLMs, exported as stored.

Each family's tiny random CausalLM of `tests/keras_hub_models.py`, quantized by Keras
(`causal_lm.quantize(mode)`), written by `save_decoder` and verified against itself; printed
per family and mode: passed, onnxruntime's largest logit error and the share of the bound it
used (int8: the int8-rounding bound; int4: accuracy_level 4's), or the refusal's message.

    python -m benchmarks.keras_quantized_agreement                   # every family, both modes
    python -m benchmarks.keras_quantized_agreement --modes int8 --families llama qwen3
"""

from __future__ import annotations

import os

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import argparse  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import warnings  # noqa: E402
from pathlib import Path  # noqa: E402

FAMILIES = ["llama", "llama3", "mistral", "qwen2", "qwen3", "phi3", "gemma", "gemma2"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--modes", nargs="+", default=["int8", "int4"])
    parser.add_argument("--families", nargs="+", default=FAMILIES)
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from keras_hub_models import tiny_causal_lm

    from keras_posenc.export import save_decoder
    from keras_posenc.export.errors import ExportError

    warnings.filterwarnings("ignore")
    with tempfile.TemporaryDirectory() as folder:
        for family in args.families:
            for mode in args.modes:
                causal_lm = tiny_causal_lm(family)
                causal_lm.quantize(mode)
                try:
                    report = save_decoder(
                        causal_lm, Path(folder) / f"{family}_{mode}", max_length=32, verbose=0
                    )
                except ExportError as error:
                    print(family, mode, "refused:", str(error)[:160], flush=True)
                    continue
                for case in report["cases"]:
                    for name, result in case["runtimes"].items():
                        used = result.get("bound_used")
                        print(
                            family,
                            mode,
                            case["name"],
                            name,
                            "passed" if result["passed"] else "FAILED",
                            f"max |error| {result['max_abs_error']:.2g}",
                            "" if used is None else f"bound used {used:.3g}",
                            flush=True,
                        )


if __name__ == "__main__":
    main()
