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
from attention_error import attention_error
from float32_error import (
    TABLE_ERROR,
    U,
    assert_within_bound,
    position_sum_error,
    table_dot_error,
)

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
    # onnxruntime-genai is an optional extra: where installed, it must pick the same tokens
    # (and save_decoder's verification runs the folder in it too).
    genai = importlib.util.find_spec("onnxruntime_genai") is not None
    verified = {"onnxruntime": True, "litert": True}
    verified.update({"onnxruntime-genai": True} if genai else {})
    assert results["verified"] == verified  # save_decoder's
    assert results["same_tokens"], results
    assert results["max_logit_difference"] <= 1e-5, results
    assert results["onnx_process_imported"] == []  # onnxruntime and numpy only
    assert results["genai_same_tokens"] is (True if genai else None), results


def test_tiny_llama_continuation_reference():
    tiny_llama = load_example("tiny_llama")
    np.testing.assert_array_equal(
        tiny_llama.periodic_continuation(np.array([5, 6, 7, 5, 6, 7, 5]), 5), [6, 7, 5, 6, 7]
    )
    np.testing.assert_array_equal(
        tiny_llama.periodic_continuation(np.array([3, 4, 3]), 3), [4, 3, 4]
    )


# --------------------------------------------------------------------------------------
# int4_llama


def test_int4_llama_is_verified_and_og_picks_the_left_padded_batchs_tokens():
    int4_llama = load_example("int4_llama")
    results = int4_llama.main(["--tiny"])
    # save_decoder's verification: the file's bytes with float arithmetic against the Keras
    # model holding the dequantized weights, and the file as written within the bound of
    # its int8 activations (docs/quantization.md).
    genai = importlib.util.find_spec("onnxruntime_genai") is not None
    verified = {"onnxruntime": True, "onnxruntime, accuracy_level 0": True}
    verified.update({"onnxruntime-genai": True} if genai else {})
    assert results["verified"] == verified
    # The projections and head at 4 bits with a float32 scale per 32 (0.16x their float32);
    # the embedding, norms and RoPE tables stay float32: 0.32x in all at the tiny size.
    assert results["int4_bytes"] < 0.4 * results["float32_weight_bytes"]
    if genai:  # each prompt alone through og.Generator, the same as the padded batch
        np.testing.assert_array_equal(results["genai_tokens"], results["onnx_tokens"])
    else:
        assert results["genai_tokens"] is None


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
    np.testing.assert_allclose(data.table, expected_table, rtol=0, atol=TABLE_ERROR)

    np.testing.assert_array_equal(data.offsets, np.arange(-size.max_offset, size.max_offset + 1))
    # p_i·p_j = Σ_k cos((i - j)·ω_k), whatever i: the relative-distance property.
    expected_dots = np.cos(np.outer(data.offsets, omega)).sum(axis=1)
    assert sorted(data.dot_products) == sorted(size.anchors)
    for anchor, dots in data.dot_products.items():
        bound = table_dot_error(size.width)
        np.testing.assert_allclose(dots, expected_dots, rtol=0, atol=bound, err_msg=str(anchor))

    np.testing.assert_allclose(
        data.wavelengths, 2 * np.pi * 10000.0 ** (np.arange(0, size.width, 2) / size.width)
    )

    # All-ones q and k: each rotated pair contributes 2·cos(offset·ω_k).
    expected_scores = 2 * np.cos(np.outer(data.offsets, frequencies(size.head_dim))).sum(axis=1)
    assert sorted(data.rope_scores) == sorted(size.anchors)
    for anchor, scores in data.rope_scores.items():
        # Rotated all-ones entries: |cos ± sin| <= sqrt(2), each within rotation_error's 2(τ + 3u).
        bound = table_dot_error(size.head_dim, 2 * (TABLE_ERROR + 3 * U), np.sqrt(2))
        np.testing.assert_allclose(scores, expected_scores, rtol=0, atol=bound, err_msg=str(anchor))


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


# --------------------------------------------------------------------------------------
# where_is_it (a tiny ViT on patch grids: no / 1D / 2D sinusoidal / 2D axial RoPE positions)


def _patch_colors(images: np.ndarray, grid: int, patch: int) -> np.ndarray:
    """The mean colour of every patch, `(count, grid, grid, 3)`, by plain numpy."""
    count = images.shape[0]
    return images.reshape(count, grid, patch, grid, patch, 3).mean(axis=(2, 4))


def test_where_is_it_labels_are_what_the_pixels_say():
    where_is_it = load_example("where_is_it")
    size = where_is_it.TINY
    grid, patch = size.grid, size.patch
    images, labels, where = where_is_it.make_images(300, size, np.random.default_rng(3))
    colors = _patch_colors(images, grid, patch)
    redness = (colors[..., 0] - colors[..., 2]).reshape(len(images), -1)
    red = np.stack(np.divmod(redness.argmax(axis=1), grid), -1)
    blue = np.stack(np.divmod((-redness).argmax(axis=1), grid), -1)
    np.testing.assert_array_equal(where[:, 0], red)
    np.testing.assert_array_equal(where[:, 1], blue)
    # Exactly one red and one blue patch; the rest grey.
    assert np.all(np.sort(np.abs(redness), axis=1)[:, -3] < 0.3)
    assert np.all(red[:, 1] != blue[:, 1])
    np.testing.assert_array_equal(labels, red[:, 1] < blue[:, 1])
    assert 0.4 < labels.mean() < 0.6
    assert len(np.unique(red[:, 0] - blue[:, 0])) == 2 * grid - 1  # rows anywhere

    test_images, test_labels = where_is_it.make_twin_test_set(50, size, np.random.default_rng(4))
    originals, twins = test_images[:50], test_images[50:]
    np.testing.assert_array_equal(test_labels[:50], 1 - test_labels[50:])

    def sorted_patches(batch):
        patches = batch.reshape(len(batch), grid, patch, grid, patch, 3).transpose(0, 1, 3, 2, 4, 5)
        patches = patches.reshape(len(batch), grid * grid, -1)
        return np.stack([p[np.lexsort(p.T[::-1])] for p in patches])

    # The same patches, only at other places: a permutation-invariant model cannot tell.
    np.testing.assert_array_equal(sorted_patches(originals), sorted_patches(twins))
    twin_redness = (_patch_colors(twins, grid, patch) @ [1, 0, -1]).reshape(50, -1)
    twin_red = np.stack(np.divmod(twin_redness.argmax(axis=1), grid), -1)
    original_redness = (_patch_colors(originals, grid, patch) @ [1, 0, -1]).reshape(50, -1)
    original_blue = np.stack(np.divmod(original_redness.argmin(axis=1), grid), -1)
    np.testing.assert_array_equal(twin_red, original_blue)
    np.testing.assert_array_equal(
        test_labels[50:], 1 - (original_redness.argmax(1) % grid < original_blue[:, 1])
    )


def test_where_is_it_patches_follow_the_row_major_grid():
    where_is_it = load_example("where_is_it")
    grid, patch = 3, 2
    # Every pixel of the patch in row r, column c holds 10·r + c.
    rows, columns = np.divmod(np.arange(grid * grid), grid)
    values = (10 * rows + columns).reshape(grid, grid)
    images = np.repeat(np.repeat(values, patch, 0), patch, 1)[None, :, :, None]
    images = np.repeat(images, 3, axis=-1).astype(np.float32)
    sequence = np.asarray(where_is_it.patchify(images, grid, patch))[0]
    np.testing.assert_array_equal(sequence, np.repeat((10 * rows + columns)[:, None], 12, 1))
    positions = where_is_it.grid_positions(grid, grid)
    np.testing.assert_array_equal(positions, np.stack([rows, columns], -1))


def test_where_is_it_models_add_the_positions_of_their_patches():
    import reference

    where_is_it = load_example("where_is_it")
    size = where_is_it.TINY
    grid, width = size.grid, size.width
    rows, columns = np.divmod(np.arange(grid * grid), grid)
    images = np.random.default_rng(5).uniform(size=(2, grid * size.patch, grid * size.patch, 3))
    expected = {
        "sinusoidal_1d": reference.sinusoidal(np.arange(grid * grid), width),
        "sinusoidal_2d": np.concatenate(
            [reference.sinusoidal(rows, width // 2), reference.sinusoidal(columns, width // 2)], -1
        ),
    }
    for variant, encoding in expected.items():
        model = where_is_it.build_classifier(variant, size)
        probe = keras.Model(
            model.input,
            [model.get_layer("patch_embedding").output, model.get_layer("positions").output],
        )
        embedded, encoded = (np.asarray(t, np.float64) for t in probe(images.astype(np.float32)))
        # `encoded` is the float32 sum `embedded + row`: within position_sum_error of the exact.
        assert_within_bound(
            encoded, embedded + encoding, position_sum_error(embedded), what=variant
        )


def _axial_rope_attention(layer, x: np.ndarray, rows: np.ndarray, columns: np.ndarray, bound=False):
    """Self-attention with (row, column) axial RoPE on queries and keys, in float64 numpy;
    with `bound`, also the most a float32 evaluation can be off (`attention_error`)."""
    import reference

    weights = {
        w.path.split("/")[-2] + "/" + w.name: np.asarray(w, np.float64) for w in layer.weights
    }

    def project(name):
        return np.einsum("bsw,whd->bshd", x, weights[f"{name}/kernel"]) + weights[f"{name}/bias"]

    query, key, value = project("query"), project("key"), project("value")
    head = query.shape[-1]
    omega = reference.inverse_frequencies(head // 2)
    angles = np.concatenate([rows[:, None] * omega, columns[:, None] * omega], -1)
    sin, cos = np.sin(angles)[:, None, :], np.cos(angles)[:, None, :]

    def rotate(t):  # pair k is channels (k, k + head/2)
        a, b = t[..., : head // 2], t[..., head // 2 :]
        return np.concatenate([a * cos - b * sin, b * cos + a * sin], -1)

    scores = np.einsum("bqhd,bkhd->bhqk", rotate(query), rotate(key)) / np.sqrt(head)
    scores = np.exp(scores - scores.max(-1, keepdims=True))
    scores /= scores.sum(-1, keepdims=True)
    attended = np.einsum("bhqk,bkhd->bqhd", scores, value)
    output = (
        np.einsum("bshd,hdw->bsw", attended, weights["attention_output/kernel"])
        + weights["attention_output/bias"]
    )
    if not bound:
        return output
    heads, width = query.shape[2], x.shape[-1]
    kernels = {
        name: weights[f"{name}/kernel"].reshape(width, heads * head)
        for name in ("query", "key", "value")
    } | {f"{name}_bias": weights[f"{name}/bias"].ravel() for name in ("query", "key", "value")}
    kernels["output"] = weights["attention_output/kernel"].reshape(heads * head, width)
    kernels["output_bias"] = weights["attention_output/bias"]
    error = attention_error(
        x,
        kernels,
        heads=heads,
        kv_heads=heads,
        head_dim=head,
        scale=head**-0.5,
        weights=scores,
        causal=False,
    )
    return output, error


def test_where_is_it_rope_attention_rotates_by_row_and_column():
    where_is_it = load_example("where_is_it")
    size = where_is_it.TINY
    grid = size.grid
    rows, columns = np.divmod(np.arange(grid * grid), grid)
    model = where_is_it.build_classifier("rope_2d", size)
    attention = model.get_layer("attention")
    probe = keras.Model(model.input, [model.get_layer("patch_embedding").output, attention.output])
    images = np.random.default_rng(6).uniform(size=(2, grid * size.patch, grid * size.patch, 3))
    embedded, attended = (np.asarray(t, np.float64) for t in probe(images.astype(np.float32)))
    expected, bound = _axial_rope_attention(attention, embedded, rows, columns, bound=True)
    assert_within_bound(attended, expected, bound, what="axial RoPE attention")
    assert bound.max() < 1e-2  # below the swapped axes' difference
    # Swapping the axes is a different model: the check above could fail.
    assert np.abs(_axial_rope_attention(attention, embedded, columns, rows) - attended).max() > 1e-2


def test_where_is_it_without_positions_cannot_see_where_the_patches_are():
    where_is_it = load_example("where_is_it")
    size = where_is_it.TINY
    grid, patch = size.grid, size.patch
    images, _, _ = where_is_it.make_images(8, size, np.random.default_rng(7))
    order = np.random.default_rng(8).permutation(grid * grid)
    blocks = images.reshape(8, grid, patch, grid, patch, 3).transpose(0, 1, 3, 2, 4, 5)
    shuffled = blocks.reshape(8, grid * grid, patch, patch, 3)[:, order]
    shuffled = shuffled.reshape(8, grid, grid, patch, patch, 3).transpose(0, 1, 3, 2, 4, 5)
    shuffled = shuffled.reshape(images.shape)
    assert not np.array_equal(shuffled, images)
    for variant in where_is_it.VARIANTS:
        model = where_is_it.build_classifier(variant, size)
        change = np.abs(np.asarray(model(shuffled)) - np.asarray(model(images))).max()
        if variant == "none":
            assert change <= 1e-6, change
        else:
            assert change > 1e-4, (variant, change)


def test_where_is_it_without_positions_is_chance_and_2d_positions_solve_it():
    where_is_it = load_example("where_is_it")
    accuracies = where_is_it.main(["--tiny"])
    assert list(accuracies) == ["none", "sinusoidal_1d", "sinusoidal_2d", "rope_2d"]
    # Each test image has a twin with the same patches and the other label.
    assert accuracies["none"] == pytest.approx(0.5, abs=0.01)
    for variant in ("sinusoidal_2d", "rope_2d"):
        assert accuracies[variant] >= 0.95, (variant, accuracies)
        # The column is a sawtooth of the 1D position: clearly harder from 1D positions.
        assert accuracies["sinusoidal_1d"] <= accuracies[variant] - 0.1, accuracies


def test_sinusoidal_2d_figure_data_follow_the_formula():
    import reference

    plot_encodings = load_example("plot_encodings")
    size = plot_encodings.GRID_TINY
    grid, width = size.grid, size.width
    data = plot_encodings.grid_figure_data(tiny=True)
    rows, columns = np.divmod(np.arange(grid * grid), grid)
    np.testing.assert_array_equal(data.positions, np.stack([rows, columns], -1))
    table_2d = np.concatenate(
        [reference.sinusoidal(rows, width // 2), reference.sinusoidal(columns, width // 2)], -1
    )
    table_1d = reference.sinusoidal(np.arange(grid * grid), width)
    np.testing.assert_allclose(data.table_2d, table_2d, rtol=0, atol=TABLE_ERROR)
    np.testing.assert_allclose(data.table_1d, table_1d, rtol=0, atol=TABLE_ERROR)
    # A row's dot product with another, over width / 2 (one rounding more).
    bound = table_dot_error(width) / (width / 2) + U * (1 + table_dot_error(width))
    assert sorted(data.similarity_2d) == sorted(data.similarity_1d) == sorted(size.references)
    for (row, column), similarity in data.similarity_2d.items():
        # Every row of the table has norm sqrt(width/2): one (sin, cos) pair per frequency.
        expected = (table_2d @ table_2d[row * grid + column] / (width / 2)).reshape(grid, grid)
        np.testing.assert_allclose(similarity, expected, rtol=0, atol=bound)
        assert similarity[row, column] == pytest.approx(1.0, abs=bound)
    for (row, column), similarity in data.similarity_1d.items():
        expected = (table_1d @ table_1d[row * grid + column] / (width / 2)).reshape(grid, grid)
        np.testing.assert_allclose(similarity, expected, rtol=0, atol=bound)


def test_sinusoidal_2d_figure_is_checked_in_and_small():
    content = (DOCS / "sinusoidal_2d.png").read_bytes()
    assert content[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(content) < 200 * 1024


def test_plot_encodings_writes_only_where_told(capsys):
    """No default folder: the README's figures in docs/ change only with `--out docs`."""
    plot_encodings = load_example("plot_encodings")
    before = {path: path.stat().st_mtime_ns for path in DOCS.glob("*.png")}
    with pytest.raises(SystemExit) as exit_:
        plot_encodings.main([])
    assert exit_.value.code == 2
    assert "--out" in capsys.readouterr().err
    assert {path: path.stat().st_mtime_ns for path in DOCS.glob("*.png")} == before


# --------------------------------------------------------------------------------------
# litertlm_chat


def test_litertlm_chat_engine_text_is_keras_hub_text(tmp_path):
    """The bundle the example writes, in LiteRT-LM's engine: keras_hub's greedy text for each
    prompt (a few epochs: the claim is the export, not the training)."""
    pytest.importorskip("litert_lm")
    pytest.importorskip("litert_lm_builder")
    litertlm_chat = load_example("litertlm_chat")
    result = litertlm_chat.main(["--out", str(tmp_path / "chat"), "--epochs", "2"])
    assert (tmp_path / "chat" / "model.litertlm").is_file()
    assert len(result["litert_lm"]) == len(litertlm_chat.PROMPTS)
    assert all(result["keras_hub"]), result  # texts to compare, not empty ones
    assert result["litert_lm"] == result["keras_hub"]
