"""`keras_posenc_serve`: a `save_decoder` folder run by onnxruntime and numpy alone.

The tokens must be Keras's greedy tokens (`keras_greedy` on the step model, the
verification's reference) at batch 1 and in a left-padded batch of 4, each row of the batch
those of the row alone, and onnxruntime-genai's `og.Generator`'s at batch 1; importing and
running it must not import Keras or TensorFlow.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import keras
import numpy as np
import pytest

import keras_posenc_serve
from keras_posenc import DecoderBlock, decoder_models
from keras_posenc.export import save_decoder
from keras_posenc.export.decoder import keras_greedy, logit_tolerance

VOCABULARY, WIDTH, MAX_LENGTH = 40, 32, 48
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """`(step model, folder)`: a 2-layer decoder saved unverified (the tests compare)."""
    keras.utils.set_random_seed(0)
    blocks = [DecoderBlock(16, 4, 2, 48, name=f"b{i}") for i in range(2)]
    embedding = keras.layers.Embedding(VOCABULARY, WIDTH, embeddings_initializer="normal")
    head = keras.layers.Dense(VOCABULARY, use_bias=False, kernel_initializer="normal")
    step = decoder_models(
        embedding, blocks, keras.layers.RMSNormalization(), head, max_length=MAX_LENGTH
    )[1]
    folder = tmp_path_factory.mktemp("serve") / "decoder"
    save_decoder(step, folder, max_length=MAX_LENGTH, verify=False)
    return step, folder


def _padded_case(pads=(0, 1, 2, 3), length=6, seed=1):
    rng = np.random.default_rng(seed)
    prompts = rng.integers(1, VOCABULARY, (len(pads), length)).astype(np.int64)
    mask = np.ones_like(prompts)
    for row, pad in enumerate(pads):
        prompts[row, :pad], mask[row, :pad] = 0, 0
    return prompts, mask


@pytest.mark.parametrize("pads", [(0,), (0, 1, 2, 3)], ids=["batch1", "batch4-left-padded"])
def test_greedy_tokens_are_keras_greedy_tokens(exported, pads):
    step, folder = exported
    prompts, mask = _padded_case(pads)
    steps = 20
    expected_tokens, expected_logits = keras_greedy(step, prompts, mask, steps - 1)
    decoder = keras_posenc_serve.load(folder)
    tokens, logits = decoder.generate(prompts, steps, mask=mask, return_logits=True)
    assert tokens.shape == (len(pads), steps)  # steps means new tokens
    np.testing.assert_array_equal(tokens, expected_tokens)
    # The logits each token was chosen from, within the verification's own tolerance.
    reference = [expected_logits[0][:, -1], *expected_logits[1:]]
    for step, expected in enumerate(reference):
        bound = logit_tolerance.ATOL + logit_tolerance.RTOL * logit_tolerance.row_scale(expected)
        assert np.all(np.abs(logits[:, step] - expected) <= bound), step


def test_left_padded_rows_decode_as_each_row_alone(exported):
    _, folder = exported
    decoder = keras_posenc_serve.load(folder)
    rows = [[5, 9, 2, 7, 1, 3], [8, 4, 6], [11], [3, 3, 30, 12, 1]]
    batch = decoder.generate(rows, 16)
    for r, row in enumerate(rows):
        np.testing.assert_array_equal(batch[r], decoder.generate([row], 16)[0])


def test_tokens_are_og_generator_tokens_at_batch_1(exported):
    og = pytest.importorskip("onnxruntime_genai")
    _, folder = exported
    prompt = [5, 9, 2, 7, 1, 3]
    steps = 30
    model = og.Model(str(folder))
    params = og.GeneratorParams(model)
    params.set_search_options(do_sample=False, max_length=len(prompt) + steps)
    generator = og.Generator(model, params)
    generator.append_tokens(np.array([prompt], np.int32))
    expected = []
    while not generator.is_done():
        generator.generate_next_token()
        expected.append(int(generator.get_next_tokens()[0]))
    eos = json.loads((folder / "genai_config.json").read_text())["model"]["eos_token_id"]
    stops = eos if isinstance(eos, list) else [eos]
    tokens = keras_posenc_serve.load(folder).generate([prompt], steps, stop_token_ids=stops)[0]
    # og ends at its end token without keeping it in the sequence; the rest here is padding.
    np.testing.assert_array_equal(tokens[: len(expected)], expected)
    if len(expected) < steps:
        assert tokens[len(expected)] in stops


def test_stop_token_ids_end_a_row_and_pad_the_rest(exported):
    _, folder = exported
    decoder = keras_posenc_serve.load(folder)
    rows = [[5, 9, 2, 7, 1, 3], [8, 4, 6]]
    free = decoder.generate(rows, 12)
    stop = int(free[0, 3])
    stopped = decoder.generate(rows, 12, stop_token_ids=[stop])
    first = int(np.argmax(free[0] == stop))
    np.testing.assert_array_equal(stopped[0, : first + 1], free[0, : first + 1])
    assert (stopped[0, first + 1 :] == decoder.pad_token_id).all()
    if stop in free[1]:
        end = int(np.argmax(free[1] == stop))
        np.testing.assert_array_equal(stopped[1, : end + 1], free[1, : end + 1])
    else:
        np.testing.assert_array_equal(stopped[1], free[1])


def test_max_length_is_a_clear_error(exported):
    _, folder = exported
    decoder = keras_posenc_serve.load(folder)
    assert decoder.generate([[1, 2, 3]], MAX_LENGTH - 3).shape == (1, MAX_LENGTH - 3)
    with pytest.raises(ValueError, match="past this folder's max_length of 48"):
        decoder.generate([[1, 2, 3]], MAX_LENGTH - 2)


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda d: d.generate([[1, VOCABULARY]], 2), r"prompts must be token ids in \[0, 40\)"),
        (lambda d: d.generate([[1, -1]], 2), r"prompts must be token ids"),
        (lambda d: d.generate([[1, 2]], 0), "steps must be an integer >= 1"),
        (lambda d: d.generate([[1, 2]], 2.0), "steps must be an integer >= 1"),
        (lambda d: d.generate([[1, 2]], 2, stop_token_ids=[99]), "stop_token_ids must be"),
        (lambda d: d.generate([[1, 2]], 2, temperature=-1), "temperature must be >= 0"),
        (lambda d: d.generate([[1, 2]], 2, top_p=0), r"top_p must be in \(0, 1\]"),
        (lambda d: d.generate([[1, 2]], 2, top_k=0), "top_k must be None or an integer"),
        (lambda d: d.generate(np.array([[1, 2]]), 2, mask=np.array([[1, 0]])), "pad on the left"),
        (lambda d: d.generate([[]], 2), "at least one token"),
    ],
)
def test_bad_arguments_are_refused_by_name(exported, call, message):
    with pytest.raises(ValueError, match=message):
        call(keras_posenc_serve.load(exported[1]))


def test_sampling_is_reproducible_and_top_k_1_is_greedy(exported):
    _, folder = exported
    decoder = keras_posenc_serve.load(folder)
    rows = [[5, 9, 2, 7, 1, 3], [8, 4, 6]]
    greedy = decoder.generate(rows, 10)
    np.testing.assert_array_equal(decoder.generate(rows, 10, temperature=1.5, top_k=1), greedy)
    a = decoder.generate(rows, 10, temperature=1.5, seed=3)
    np.testing.assert_array_equal(a, decoder.generate(rows, 10, temperature=1.5, seed=3))
    assert not np.array_equal(a, decoder.generate(rows, 10, temperature=1.5, seed=4))


def test_probabilities_are_the_definitions():
    """Temperature, top-k then top-p, against a direct float64 computation."""
    logits = np.array([[2.0, 1.0, 0.5, 0.0, -1.0, 3.0]])
    t = 0.7
    p = np.exp(logits[0] / t)
    p /= p.sum()
    np.testing.assert_allclose(keras_posenc_serve.probabilities(logits, t, None, 1.0)[0], p)
    top3 = np.where(np.isin(np.arange(6), [5, 0, 1]), p, 0)
    np.testing.assert_allclose(
        keras_posenc_serve.probabilities(logits, t, 3, 1.0)[0], top3 / top3.sum()
    )
    # top-p: the fewest likeliest tokens whose mass reaches top_p.
    order = np.argsort(-p)
    needed = int(np.searchsorted(np.cumsum(p[order]), 0.9) + 1)
    kept = np.where(np.isin(np.arange(6), order[:needed]), p, 0)
    np.testing.assert_allclose(
        keras_posenc_serve.probabilities(logits, t, None, 0.9)[0], kept / kept.sum()
    )


def test_draws_follow_the_probabilities():
    """Frequencies of 20000 draws within 5 standard deviations of each probability."""
    logits = np.array([[1.0, 0.0, -0.5, 2.0]])
    expected = keras_posenc_serve.probabilities(logits, 1.0, None, 1.0)[0]
    rng = np.random.default_rng(0)
    n = 20000
    draws = np.array([keras_posenc_serve.next_tokens(logits, [rng], 1.0)[0] for _ in range(n)])
    counts = np.bincount(draws, minlength=4) / n
    assert np.all(np.abs(counts - expected) <= 5 * np.sqrt(expected * (1 - expected) / n))


SNIPPET = """
import sys, time, resource
start = time.perf_counter()
import keras_posenc_serve
elapsed = time.perf_counter() - start
decoder = keras_posenc_serve.load(sys.argv[1])
tokens = decoder.generate([[5, 9, 2], [7, 1]], steps=20)
assert tokens.shape == (2, 20), tokens.shape
assert "keras" not in sys.modules and "tensorflow" not in sys.modules, sorted(
    m for m in sys.modules if m.split(".")[0] in ("keras", "tensorflow")
)
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
print(f"import {elapsed:.2f} s, peak RSS {peak} MB")
"""


def test_serving_imports_neither_keras_nor_tensorflow(exported):
    run = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(SNIPPET), str(exported[1])],
        cwd=ROOT,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    assert "import" in run.stdout


def _doc_blocks() -> list[str]:
    """The python blocks of docs/decoding.md's section on serving without TensorFlow."""
    text = (ROOT / "docs" / "decoding.md").read_text()
    section = text.split("## Serving a folder without TensorFlow")[1].split("\n## ")[0]
    return [block.split("```")[0] for block in section.split("```python\n")[1:]]


def test_the_docs_serving_snippets_run(tmp_path):
    """The export block (with Keras), then the serving block in a fresh process whose
    environment has only the checkout on its path."""
    export, serve = _doc_blocks()
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)}
    with_keras = {**os.environ, "PYTHONPATH": str(ROOT)}
    for block, environment in ((export, with_keras), (serve, env)):
        run = subprocess.run(
            [sys.executable, "-c", block],
            cwd=tmp_path,
            env=environment,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.strip() == "(2, 20)"
