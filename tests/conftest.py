"""Shared fixtures: the TensorFlow backend, execution modes, and graph inspection."""

from __future__ import annotations

import dataclasses
import gc
import os

# Before anything imports Keras: the package needs the TensorFlow backend.
os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402
from hypothesis import settings  # noqa: E402
from position_kinds import POSITION_KINDS  # noqa: E402

# Few examples, no deadline: each example runs TensorFlow ops on a shared 2-core machine.
settings.register_profile("keras_posenc", max_examples=20, deadline=None, derandomize=True)
settings.load_profile("keras_posenc")

MODES = ("eager", "function", "jit")


@pytest.fixture(autouse=True)
def _seeded():
    keras.utils.set_random_seed(1234)


@pytest.fixture(params=MODES)
def mode(request) -> str:
    """Each execution mode a layer must work in: eager, `tf.function`, and XLA."""
    return request.param


@pytest.fixture
def in_mode(mode):
    """`in_mode(fn, signature)`: `fn` run eagerly, or traced once for `signature` (dynamic dims).

    The traced versions have an explicit `input_signature`, so one trace serves every
    sequence length and every start index passed as a tensor.
    """

    def wrap(fn, signature):
        if mode == "eager":
            return fn
        return tf.function(fn, input_signature=signature, jit_compile=(mode == "jit"))

    return wrap


def _attr_dtypes(attr) -> set:
    """Every dtype an op attribute names (a type, a list of types, or a constant's tensor)."""
    dtypes = set()
    if attr.HasField("type"):
        dtypes.add(attr.type)
    if attr.HasField("list"):
        dtypes.update(attr.list.type)
    if attr.HasField("tensor"):
        dtypes.add(attr.tensor.dtype)
    return {tf.dtypes.as_dtype(d) for d in dtypes if d}


def graph_summary(concrete_function) -> tuple[set[str], set[tf.dtypes.DType]]:
    """`(op types, dtypes)` of every node of a traced function and of the functions it calls."""
    graph_def = concrete_function.graph.as_graph_def()
    nodes = list(graph_def.node)
    for function in graph_def.library.function:
        nodes.extend(function.node_def)
    op_types = {node.op for node in nodes}
    dtypes = set()
    for node in nodes:
        for attr in node.attr.values():
            dtypes |= _attr_dtypes(attr)
    return op_types, dtypes


@pytest.fixture
def traced_graph():
    """`traced_graph(concrete_function)` -> `(op types, dtypes)` over the graph and its library."""
    return graph_summary


@dataclasses.dataclass(frozen=True)
class PositionsCase:
    """One way of giving a call its positions, and the positions the reference must see.

    Attributes:
        keyword: `"positions"`, `"start_index"`, or None for the default `0 .. length-1`.
        value: the tensor passed as `keyword`.
        spec: the `TensorSpec` of `value` in a traced call.
        positions: `(batch, length)` positions, for the reference.
    """

    keyword: str | None
    value: tf.Tensor | None
    spec: tf.TensorSpec | None
    positions: np.ndarray

    def bind(self, layer):
        """`fn(inputs, *where)` calling `layer(inputs, keyword=where[0])`."""

        def call(inputs, *where):
            return layer(inputs, **({self.keyword: where[0]} if where else {}))

        return call

    def signature(self, input_spec: tf.TensorSpec) -> list:
        return [input_spec] + ([self.spec] if self.keyword else [])

    def arguments(self, inputs) -> tuple:
        return (tf.convert_to_tensor(inputs),) + ((self.value,) if self.keyword else ())


def _positions_case(kind: str, batch: int, length: int, limit: int = 2**24) -> PositionsCase:
    rng = np.random.default_rng(7)
    run = np.arange(length)
    if kind == "default":
        return PositionsCase(None, None, None, np.broadcast_to(run, (batch, length)))
    if kind in ("start_index", "far_start_index"):
        # "start_index" straddles the end of the cached rows, as a tensor (decoding).
        start = min(4090 if kind == "start_index" else 3_000_017, limit - length)
        dtype = tf.int32 if kind == "start_index" else tf.int64
        return PositionsCase(
            "start_index",
            tf.constant(start, dtype),
            tf.TensorSpec([], dtype),
            np.broadcast_to(run + start, (batch, length)),
        )
    if kind == "positions_1d":
        positions = rng.integers(0, limit, size=length)
        return PositionsCase(
            "positions",
            tf.constant(positions, tf.int64),
            tf.TensorSpec([None], tf.int64),
            np.broadcast_to(positions, (batch, length)),
        )
    positions = rng.integers(0, limit, size=(batch, length))
    return PositionsCase(
        "positions",
        tf.constant(positions, tf.int32),
        tf.TensorSpec([None, None], tf.int32),
        positions,
    )


@pytest.fixture
def positions_case():
    """`positions_case(kind, batch, length, limit=2**24)` -> a `PositionsCase`."""
    return _positions_case


@pytest.fixture(params=POSITION_KINDS)
def position_kind(request) -> str:
    """Each way of giving positions: default, start index (cached / far), 1-D, 2-D."""
    return request.param


# save_decoder refuses, by name, the parts onnxruntime computes otherwise below 1.32
# (`export/decoder/runtime_version.py`): on the minimum versions (1.23) a test that exports
# such a decoder is skipped, saying so, instead of failing on the refusal it is meant to see.
_OLDER_ONNXRUNTIME_REFUSAL = "computes otherwise than the export means them"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if call.excinfo is None or report.outcome != "failed":
        return
    from keras_posenc.export.decoder import runtime_version
    from keras_posenc.export.errors import ExportError

    error = call.excinfo.value
    while error is not None:  # also a refusal under `pytest.raises(match=...)`'s mismatch
        refused = isinstance(error, ExportError) and _OLDER_ONNXRUNTIME_REFUSAL in str(error)
        if refused and runtime_version._installed() < runtime_version.VERIFIED_FROM:
            report.outcome = "skipped"
            report.longrepr = (str(item.path), item.location[1] or 0, f"Skipped: {error}")
            return
        error = error.__cause__ or error.__context__


def pytest_collection_finish(session) -> None:
    """Everything imported and collected so far (TensorFlow, Keras, ONNX, the test modules:
    about 400,000 objects) moved out of the garbage collector's reach (`gc.freeze`).

    These objects live for the whole session, yet every full collection walked them all;
    full collections are frequent here (`on_demand.OneAtATime.close` asks for one each time
    a verification moves to the next runtime, Keras's `Layer.__delattr__` for each kernel
    `quantize()` replaces). Objects made by the tests are collected as before.
    """
    gc.collect()
    gc.freeze()
