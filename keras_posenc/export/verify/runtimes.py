"""One runner per runtime: Keras, the SavedModel, onnxruntime and LiteRT, on the same feeds.

Each runner takes `{input name: array}`: `runner(feeds)` returns `{output name: array}`,
and `runner.prepared(feeds)` a call with the inputs already converted (what is timed).
`onnx_session` is the one quiet onnxruntime session of the package, its tests and its
benchmarks.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from keras_posenc.export.litert import LiteRTRunner
from keras_posenc.export.signature import input_signature, serving_function

RUNTIMES = ("keras", "saved_model", "onnxruntime", "litert")


def onnx_session(model, *, threads: int | None = None, spinning: bool = True, arena: bool = True):
    """A quiet onnxruntime CPU session (errors only) of an ONNX file, its bytes or a proto.

    Args:
        model: the `.onnx` path, the serialized bytes, or an `onnx.ModelProto`.
        threads: onnxruntime's intra-op threads (default: its own choice).
        spinning: False keeps its threads from spinning after a run, waiting for the next
            (interleaved with TensorFlow they would take its cores).
        arena: False gives memory back after each run; onnxruntime's arena otherwise keeps
            (and fragments) the largest run's, which a verification's 4096-token cases make
            hundreds of MB. Latency at ordinary sizes is the same within noise.
    """
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.log_severity_level = 3
    if threads is not None:
        options.intra_op_num_threads = threads
    if not spinning:
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.enable_cpu_mem_arena = arena
    if hasattr(model, "SerializeToString"):
        model = model.SerializeToString()
    elif not isinstance(model, bytes):
        model = str(model)
    return onnxruntime.InferenceSession(model, options, providers=["CPUExecutionProvider"])


def as_numpy(outputs: dict) -> dict[str, np.ndarray]:
    """`{name: array}` of a runtime's outputs (tensors or arrays)."""
    return {name: np.asarray(value) for name, value in outputs.items()}


class _Runner:
    def prepared(self, feeds: dict) -> Callable[[], dict]:
        raise NotImplementedError

    def __call__(self, feeds: dict) -> dict[str, np.ndarray]:
        return as_numpy(self.prepared(feeds)())


class KerasRunner(_Runner):
    """The model as the serving function the artifacts were made from, traced apart.

    A graph with the same dynamic axes as the exported one runs the same kernels, so a
    SavedModel's error measures what saving and loading change (a graph traced per
    shape, or eager execution, picks other kernels and differs by ~1e-6 of float32).
    """

    def __init__(self, model: keras.Model):
        self.specs = input_signature(model)
        self.function = serving_function(model)

    def prepared(self, feeds: dict) -> Callable[[], dict]:
        ordered = [tf.constant(feeds[spec.name]) for spec in self.specs]
        return lambda: self.function(*ordered)


class SavedModelRunner(_Runner):
    """The SavedModel folder's `serving_default`, loaded by TensorFlow alone."""

    def __init__(self, path: str | os.PathLike):
        self.serve = tf.saved_model.load(str(path)).signatures["serving_default"]

    def prepared(self, feeds: dict) -> Callable[[], dict]:
        tensors = {name: tf.constant(value) for name, value in feeds.items()}
        return lambda: self.serve(**tensors)


class OnnxRunner(_Runner):
    """The ONNX file in a quiet onnxruntime session (`onnx_session`, its threads not
    spinning between calls, no arena: each case's memory is given back)."""

    def __init__(self, model, threads: int | None = None):
        self.session = onnx_session(model, threads=threads, spinning=False, arena=False)
        self.outputs = [o.name for o in self.session.get_outputs()]

    def prepared(self, feeds: dict) -> Callable[[], dict]:
        return lambda: dict(zip(self.outputs, self.session.run(None, feeds), strict=True))


class LiteRTFileRunner(_Runner):
    """The `.tflite` file's `serving_default` (`LiteRTRunner`), resized before the call."""

    def __init__(self, path_or_content):
        self.runner = LiteRTRunner(path_or_content)

    def prepared(self, feeds: dict) -> Callable[[], dict]:
        self.runner.prepare(feeds)  # resizing is not part of a call's latency
        return lambda: self.runner(feeds)


RUNNERS = {
    "saved_model": SavedModelRunner,
    "onnxruntime": OnnxRunner,
    "litert": LiteRTFileRunner,
}


def artifact_runners(paths: dict[str, Path]) -> dict[str, _Runner]:
    """`{runtime: runner}` for the artifacts `{"saved_model" | "onnxruntime" | "litert": path}`."""
    return {name: RUNNERS[name](path) for name, path in paths.items()}


class Runtimes:
    """Keras and the artifacts given, in `RUNTIMES` order of `paths`, on the same feeds."""

    def __init__(self, model: keras.Model, paths: dict[str, Path]):
        self.runners = {"keras": KerasRunner(model), **artifact_runners(paths)}
        self.names = list(self.runners)

    def calls(self, feeds: dict) -> dict[str, Callable[[], dict]]:
        """Per runtime, a call with the inputs already converted, returning `{name: output}`."""
        return {name: runner.prepared(feeds) for name, runner in self.runners.items()}


def median_latencies(calls: dict[str, Callable[[], Any]], repeats: int) -> dict[str, float]:
    """Median milliseconds per call, the calls interleaved so that they share the machine.

    The order rotates from one round to the next: what one call leaves behind (threads
    still awake, caches) falls on each of the others in turn.
    """
    names = list(calls)
    samples = {name: [] for name in names}
    for round_ in range(repeats):
        shift = round_ % len(names)
        for name in names[shift:] + names[:shift]:
            start = time.perf_counter()
            calls[name]()
            samples[name].append(time.perf_counter() - start)
    return {name: round(statistics.median(s) * 1e3, 4) for name, s in samples.items()}
