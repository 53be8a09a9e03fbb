"""The runners `verify_export` uses (`keras_posenc.export.verify.runtimes`), one per runtime.

Each runner's outputs are checked against the float64 formula (`reference.sinusoidal`);
the ONNX session against numpy on a hand-built graph.
"""

from __future__ import annotations

import time

import hand_built
import keras
import numpy as np
import pytest
import reference
from float32_error import assert_within_bound, position_sum_error
from onnx import TensorProto, helper, numpy_helper

from keras_posenc import SinusoidalPositionalEncoding
from keras_posenc import export as kpe
from keras_posenc.export.verify import runtimes

WIDTH = 8


def _add_graph():
    constant = np.arange(3, dtype=np.float32)
    return hand_built.model(
        [helper.make_node("Add", ["x", "c"], ["y"])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 3])],
        [numpy_helper.from_array(constant, "c")],
    ), constant


@pytest.mark.parametrize("form", ["proto", "bytes", "path"])
def test_the_onnx_session_runs_a_file_its_bytes_or_its_proto(tmp_path, form):
    proto, constant = _add_graph()
    model = {"proto": proto, "bytes": proto.SerializeToString()}.get(form)
    if form == "path":
        model = tmp_path / "add.onnx"
        model.write_bytes(proto.SerializeToString())
    x = np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32)
    (y,) = runtimes.onnx_session(model).run(None, {"x": x})
    np.testing.assert_array_equal(y, x + constant)


def test_the_onnx_session_is_quiet_and_takes_its_threads_and_spinning():
    proto, _ = _add_graph()
    options = runtimes.onnx_session(proto, threads=2, spinning=False).get_session_options()
    assert options.log_severity_level == 3
    assert options.intra_op_num_threads == 2
    assert options.get_session_config_entry("session.intra_op.allow_spinning") == "0"
    default = runtimes.onnx_session(proto).get_session_options()
    assert default.intra_op_num_threads == 0  # onnxruntime's own choice
    assert default.enable_cpu_mem_arena
    assert not runtimes.onnx_session(proto, arena=False).get_session_options().enable_cpu_mem_arena


def test_the_verifications_onnx_runner_gives_its_memory_back():
    proto, _ = _add_graph()
    session = runtimes.OnnxRunner(proto.SerializeToString()).session
    assert not session.get_session_options().enable_cpu_mem_arena


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    folder = tmp_path_factory.mktemp("runners")
    x = keras.Input((None, WIDTH), name="embeddings")
    model = keras.Model(x, {"encoded": SinusoidalPositionalEncoding()(x)})
    paths = {
        "saved_model": kpe.save_saved_model(model, folder / "saved_model"),
        "onnxruntime": kpe.save_onnx(model, folder / "model.onnx"),
        "litert": kpe.save_litert(model, folder / "model.tflite"),
    }
    return model, paths


@pytest.mark.parametrize("length", [1, 9, 300])
def test_every_runner_computes_the_formula(exported, length):
    model, paths = exported
    x = np.random.default_rng(length).standard_normal((2, length, WIDTH)).astype(np.float32)
    expected = x + reference.sinusoidal(np.arange(length), WIDTH)
    runners = {"keras": runtimes.KerasRunner(model), **runtimes.artifact_runners(paths)}
    assert list(runners) == ["keras", "saved_model", "onnxruntime", "litert"]
    for name, runner in runners.items():
        got = runner({"embeddings": x})
        assert list(got) == ["encoded"], name
        assert isinstance(got["encoded"], np.ndarray), name
        assert_within_bound(got["encoded"], expected, position_sum_error(x), what=name)


def test_runtimes_call_keras_first_and_then_the_artifacts_given(exported):
    model, paths = exported
    given = {name: paths[name] for name in ("onnxruntime", "litert")}
    chosen = runtimes.Runtimes(model, given)
    assert chosen.names == ["keras", "onnxruntime", "litert"]
    x = np.ones((1, 3, WIDTH), np.float32)
    calls = chosen.calls({"embeddings": x})
    assert list(calls) == chosen.names
    expected = x + reference.sinusoidal(np.arange(3), WIDTH)
    for name, call in calls.items():  # prepared calls can run again and again
        for _ in range(2):
            bound = position_sum_error(x)
            assert_within_bound(call()["encoded"], expected, bound, what=name)


def test_a_litert_runner_refuses_a_fixed_axis_of_another_size(tmp_path):
    x = keras.Input((4, WIDTH), name="embeddings")
    model = keras.Model(x, {"encoded": SinusoidalPositionalEncoding()(x)})
    runner = runtimes.LiteRTFileRunner(kpe.save_litert(model, tmp_path / "fixed.tflite"))
    with pytest.raises(ValueError, match="-1: any size"):
        runner.prepared({"embeddings": np.zeros((1, 5, WIDTH), np.float32)})


def test_median_latencies_interleave_the_calls_and_take_the_median():
    order = []

    def call(name, seconds):
        def run():
            order.append(name)
            time.sleep(seconds)

        return run

    latencies = runtimes.median_latencies(
        {"fast": call("fast", 0.0), "slow": call("slow", 0.02), "mid": call("mid", 0.005)},
        repeats=3,
    )
    # Each round starts one call later: what one leaves behind falls on each in turn.
    assert order == ["fast", "slow", "mid", "slow", "mid", "fast", "mid", "fast", "slow"]
    assert set(latencies) == {"fast", "slow", "mid"}
    assert latencies["slow"] >= 20.0 and latencies["mid"] >= 5.0
    assert latencies["fast"] < latencies["mid"] < latencies["slow"]
