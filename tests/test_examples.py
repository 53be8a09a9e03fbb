"""Every example runs at its tiny size and shows what it claims, so none of them rots.

The examples live in `examples/` (not a package); they are loaded from their files. Their
claims are checked against independent references: float64 formulas written here, the
full-sequence causal pass of Keras, the Keras model the ONNX file was exported from.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import keras
import numpy as np
import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
DOCS = Path(__file__).resolve().parent.parent / "docs"
TINY = {"KERAS_POSENC_EXAMPLE_TINY": "1"}


@functools.cache
def load_example(name: str):
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    # Registered before it runs: dataclasses look their module up in sys.modules.
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def frequencies(width: int, base: float = 10000.0) -> np.ndarray:
    return base ** (-np.arange(0, width, 2, dtype=np.float64) / width)


# --------------------------------------------------------------------------------------
# order_matters


def test_order_matters_twin_sentences_share_their_words_and_swap_the_label():
    order_matters = load_example("order_matters")
    length = 8
    tokens, labels = order_matters.make_twin_test_set(50, length, np.random.default_rng(1))
    sentences, twins = tokens[:50], tokens[50:]
    np.testing.assert_array_equal(np.sort(sentences, axis=1), np.sort(twins, axis=1))
    np.testing.assert_array_equal(labels[:50], 1 - labels[50:])
    for sentence, label in zip(tokens, labels, strict=True):
        words = [order_matters.WORDS[token] for token in sentence]
        assert sorted(w for w in words if w in ("dog", "bites", "man")) == ["bites", "dog", "man"]
        dog, bites, man = (words.index(w) for w in ("dog", "bites", "man"))
        assert min(dog, man) < bites < max(dog, man)
        assert label == (dog < man)


def test_order_matters_without_positions_is_chance_and_with_positions_is_not():
    order_matters = load_example("order_matters")
    accuracies = order_matters.main(["--tiny"])
    assert list(accuracies) == ["none", "sinusoidal", "learned", "rotary"]
    # Each test sentence has a twin with the same words and the other label; a model
    # without positions answers both alike, so it is right on exactly one of each pair.
    assert accuracies["none"] == pytest.approx(0.5, abs=0.01)
    for variant in ("sinusoidal", "learned", "rotary"):
        assert accuracies[variant] >= 0.85, (variant, accuracies)


# --------------------------------------------------------------------------------------
# tiny_llama


def test_tiny_llama_generates_the_same_tokens_in_keras_and_onnxruntime_alone():
    tiny_llama = load_example("tiny_llama")
    results = tiny_llama.main(["--tiny"])
    first_loss, last_loss = results["loss"]
    assert last_loss < first_loss - 0.5, results["loss"]  # it learned something
    assert results["traces"] == 1  # one step function for the prompt and every new token
    assert results["same_tokens"], results
    assert results["max_logit_difference"] <= 1e-5, results
    assert results["onnx_process_imported"] == []  # onnxruntime and numpy only


def test_tiny_llama_continuation_reference():
    tiny_llama = load_example("tiny_llama")
    np.testing.assert_array_equal(
        tiny_llama.periodic_continuation(np.array([5, 6, 7, 5, 6, 7, 5]), 5), [6, 7, 5, 6, 7]
    )
    np.testing.assert_array_equal(
        tiny_llama.periodic_continuation(np.array([3, 4, 3]), 3), [4, 3, 4]
    )


# --------------------------------------------------------------------------------------
# plot_encodings (the data; drawing needs matplotlib, an optional extra)


def test_plot_data_follow_the_formulas():
    plot_encodings = load_example("plot_encodings")
    size = plot_encodings.TINY
    data = plot_encodings.figure_data(tiny=True)

    omega = frequencies(size.width)
    angles = np.outer(np.arange(size.length), omega)
    expected_table = np.empty((size.length, size.width))
    expected_table[:, 0::2] = np.sin(angles)
    expected_table[:, 1::2] = np.cos(angles)
    np.testing.assert_allclose(data.table, expected_table, rtol=0, atol=1e-6)

    np.testing.assert_array_equal(data.offsets, np.arange(-size.max_offset, size.max_offset + 1))
    # p_i·p_j = Σ_k cos((i - j)·ω_k), whatever i: the relative-distance property.
    expected_dots = np.cos(np.outer(data.offsets, omega)).sum(axis=1)
    assert sorted(data.dot_products) == sorted(size.anchors)
    for anchor, dots in data.dot_products.items():
        np.testing.assert_allclose(dots, expected_dots, rtol=0, atol=1e-5, err_msg=str(anchor))

    np.testing.assert_allclose(
        data.wavelengths, 2 * np.pi * 10000.0 ** (np.arange(0, size.width, 2) / size.width)
    )

    # All-ones q and k: each rotated pair contributes 2·cos(offset·ω_k).
    expected_scores = 2 * np.cos(np.outer(data.offsets, frequencies(size.head_dim))).sum(axis=1)
    assert sorted(data.rope_scores) == sorted(size.anchors)
    for anchor, scores in data.rope_scores.items():
        np.testing.assert_allclose(scores, expected_scores, rtol=0, atol=1e-5, err_msg=str(anchor))


def test_checked_in_figures_exist_and_are_small_pngs():
    for name in (
        "sinusoidal_table",
        "sinusoidal_dot_product",
        "sinusoidal_wavelengths",
        "rope_score",
    ):
        content = (DOCS / f"{name}.png").read_bytes()
        assert content[:8] == b"\x89PNG\r\n\x1a\n", name
        assert len(content) < 200 * 1024, name


# --------------------------------------------------------------------------------------
# serve_onnx

SERVE_ONLY = """
import json, sys
import numpy as np
sys.path.insert(0, sys.argv[1])
from serve_onnx import EncoderServer

server = EncoderServer(sys.argv[2])
requests = [np.asarray(r, dtype=np.int32) for r in json.loads(sys.argv[3])]
single = [server.encode(r) for r in requests]
batched = server.encode_batch(requests)
np.savez(sys.argv[4], *single, *batched)
print(json.dumps(sorted(m for m in ("tensorflow", "keras", "keras_posenc") if m in sys.modules)))
"""


def run_python(*arguments: str) -> subprocess.CompletedProcess:
    environment = {**os.environ, "KERAS_BACKEND": "tensorflow", "TF_CPP_MIN_LOG_LEVEL": "2"}
    result = subprocess.run(
        [sys.executable, *arguments], capture_output=True, text=True, env=environment
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result


def test_serve_onnx_answers_like_keras_without_importing_tensorflow(tmp_path):
    # The whole example: export in a child process, serve in the script's own.
    result = run_python(str(EXAMPLES / "serve_onnx.py"), "--tiny", "--out", str(tmp_path))
    assert "imported by the server: none" in result.stdout

    # The serving half alone, on requests it has not seen, in a fresh interpreter.
    requests = [[7], [1, 2], [5, 4, 3, 2, 1], [9, 9, 9, 9, 9], list(range(0, 99, 3))]
    answers_path = tmp_path / "answers.npz"
    result = run_python(
        "-c",
        SERVE_ONLY,
        str(EXAMPLES),
        str(tmp_path / "encoder.onnx"),
        json.dumps(requests),
        str(answers_path),
    )
    assert json.loads(result.stdout.strip().splitlines()[-1]) == []

    model = keras.saving.load_model(tmp_path / "encoder.keras")
    answers = np.load(answers_path)
    for i, request in enumerate(requests):
        expected = np.asarray(model(np.asarray([request], dtype=np.int32)))[0]
        for copy in (i, len(requests) + i):  # the single answer, then the batched one
            np.testing.assert_allclose(answers[f"arr_{copy}"], expected, rtol=1e-4, atol=1e-5)

    server = load_example("serve_onnx").EncoderServer(tmp_path / "encoder.onnx")
    with pytest.raises(ValueError, match="non-empty"):
        server.encode([])
    with pytest.raises(ValueError, match=">= 0"):
        server.encode([3, -1])
    with pytest.raises(TypeError, match="integers"):
        server.encode([0.5, 1.0])
