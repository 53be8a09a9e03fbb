"""One exported model's three files as callables: `feeds -> {output name: array}`."""

from __future__ import annotations

from pathlib import Path

from keras_posenc.export.verify.runtimes import artifact_runners


def runners(saved_model_path, onnx_path, litert_path) -> dict:
    """`{"saved_model" | "onnxruntime" | "litert": run}`, each `run(feeds)` a dict of outputs.

    The package's own runners (`keras_posenc.export.verify.runtimes`), those `verify_export`
    times and compares.
    """
    paths = {"saved_model": saved_model_path, "onnxruntime": onnx_path, "litert": litert_path}
    return artifact_runners({name: Path(path) for name, path in paths.items()})
