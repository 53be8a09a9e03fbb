"""`save_decoder` under KERAS_BACKEND=jax or torch, without importing TensorFlow.

`python tests/backends/save_decoder_run.py OUT` (started by tests/test_backends_export.py)
exports the step model of `export_models` into `OUT/step_<attention>` (verified against
Keras on this backend: `save_decoder` raises otherwise), then calls each entry that needs
TensorFlow and checks that it refuses by name, writing nothing; `tensorflow` must then not
be in `sys.modules`. Then the keras_hub Llama, into `OUT/llama_<attention>` (keras_hub
imports TensorFlow itself where it is installed, so that part is not watched). The
attentions are `export_models.EXPORTS[backend]`. Prints one JSON line: the reports and
each refusal's message.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from without_tensorflow import first_import  # noqa: E402  (first: it watches every import)

# isort: split

import export_models  # noqa: E402
import keras  # noqa: E402

from keras_posenc import export as kpe  # noqa: E402


def _refusals(out: Path) -> dict:
    """Each TensorFlow-only entry's error, by entry; none may write its path."""
    step = export_models.step_model()
    calls = {
        "save_saved_model": lambda path: kpe.save_saved_model(step, path),
        "save_onnx": lambda path: kpe.save_onnx(step, path),
        "save_litert": lambda path: kpe.save_litert(step, path),
        "verify_export": lambda path: kpe.verify_export(step, path, path),
        "save_decoder(formats=litert)": lambda path: kpe.save_decoder(
            step, path, max_length=export_models.MAX_LENGTH, formats=("onnx", "litert")
        ),
    }
    messages = {}
    for name, call in calls.items():
        path = out / "refused" / "artifact"
        try:
            call(path)
        except kpe.ExportError as error:
            messages[name] = str(error)
        else:
            raise AssertionError(f"{name} did not refuse on {keras.backend.backend()}")
        assert not path.exists() and not path.parent.exists(), f"{name} wrote {path}"
    return messages


def _export(name: str, attention: str, out: Path) -> dict:
    build, max_length = export_models.MODELS[name]
    folder = out / f"{name}_{attention}"
    return kpe.save_decoder(build(), folder, max_length=max_length, attention=attention)


def main(out: Path) -> None:
    exports = export_models.EXPORTS[keras.backend.backend()]
    reports = {f"{n}_{a}": _export(n, a, out) for n, a in exports if n == "step"}
    refusals = _refusals(out)
    assert "tensorflow" not in sys.modules, f"TensorFlow was imported:\n{first_import.stack}"
    reports.update({f"{n}_{a}": _export(n, a, out) for n, a in exports if n != "step"})
    summary = {
        "backend": keras.backend.backend(),
        "reports": reports,
        "refusals": refusals,
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
