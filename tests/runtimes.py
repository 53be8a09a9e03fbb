"""One exported model's three files as callables: `feeds -> {output name: array}`."""

from __future__ import annotations

import onnxruntime
import tensorflow as tf

from keras_posenc import export as kpe


def runners(saved_model_path, onnx_path, litert_path) -> dict:
    """`{"saved_model" | "onnxruntime" | "litert": run}`, each `run(feeds)` a dict of outputs."""
    serve = tf.saved_model.load(str(saved_model_path)).signatures["serving_default"]
    session = onnxruntime.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return {
        "saved_model": lambda feeds: {
            k: v.numpy() for k, v in serve(**{n: tf.constant(a) for n, a in feeds.items()}).items()
        },
        "onnxruntime": lambda feeds: dict(zip(names, session.run(None, feeds), strict=True)),
        "litert": kpe.litert.LiteRTRunner(litert_path),
    }
