"""What the runtimes do with a `save_decoder` folder beyond the genai interface's usual
calls (docs/decoding.md, "What each runtime accepts"). These pin the runtimes' behaviour,
not the package's: if one starts passing, the runtime changed and the docs should say so.

- onnxruntime's `GroupQueryAttention` refuses a multi-token call after the prompt at a
  batch over 1 (one row may feed chunks).
- onnxruntime-genai 0.18 feeds a left-padded batch with an all-ones attention mask: each
  padded row generates as if its padding were tokens, not as the row alone.
"""

from __future__ import annotations

import keras
import numpy as np
import onnxruntime
import pytest

from keras_posenc import DecoderBlock, decoder_models
from keras_posenc.export import save_decoder
from keras_posenc.export.decoder import onnx_greedy
from keras_posenc.export.decoder.greedy_generation import SharedCacheSession

VOCABULARY, WIDTH, MAX_LENGTH = 40, 32, 32


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    keras.utils.set_random_seed(0)
    blocks = [DecoderBlock(16, 4, 2, 32, name="b0")]
    embedding = keras.layers.Embedding(VOCABULARY, WIDTH, embeddings_initializer="normal")
    step = decoder_models(
        embedding,
        blocks,
        keras.layers.RMSNormalization(),
        keras.layers.Dense(VOCABULARY),
        max_length=MAX_LENGTH,
    )[1]
    path = tmp_path_factory.mktemp("runtime") / "decoder"
    # Its verification is not what these tests are about (the file against each row alone
    # is checked below); an end token the short runs here do not reach; 0 pads.
    save_decoder(step, path, max_length=MAX_LENGTH, eos_token_id=VOCABULARY - 1, verify=False)
    return path


def _session(folder):
    return onnxruntime.InferenceSession(
        str(folder / "model.onnx"), providers=["CPUExecutionProvider"]
    )


def _prompt_then_chunk(session, batch: int) -> np.ndarray:
    cached = SharedCacheSession(session, batch, MAX_LENGTH)
    cached(np.tile([[1, 2, 3, 4]], (batch, 1)), np.ones((batch, 4)))
    return cached(np.tile([[5, 6]], (batch, 1)), np.ones((batch, 6)))


def test_onnxruntime_gqa_refuses_a_chunk_after_the_prompt_at_batch_2(folder):
    with pytest.raises(Exception, match="batch_size must be 1"):
        _prompt_then_chunk(_session(folder), batch=2)


def test_onnxruntime_gqa_takes_a_chunk_after_the_prompt_at_batch_1(folder):
    session = _session(folder)
    chunk = _prompt_then_chunk(session, batch=1)[:, -1]
    cached = SharedCacheSession(session, 1, MAX_LENGTH)
    cached(np.array([[1, 2, 3, 4]]), np.ones((1, 4)))
    cached(np.array([[5]]), np.ones((1, 5)))
    one_by_one = cached(np.array([[6]]), np.ones((1, 6)))[:, -1]
    # The same float32 computation in another order (a query's attention over 6 keys in one
    # kernel call or two, then sums of WIDTH terms): a rounding per term at most.
    bound = 2 * WIDTH * np.finfo(np.float32).eps * np.abs(one_by_one).max()
    np.testing.assert_allclose(chunk, one_by_one, rtol=0, atol=bound)


def _genai(folder, prompts: np.ndarray, steps: int) -> np.ndarray:
    og = pytest.importorskip("onnxruntime_genai")
    model = og.Model(str(folder))
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=prompts.shape[1] + steps, batch_size=len(prompts))
    generator = og.Generator(model, params)
    generator.append_tokens(prompts.astype(np.int32))
    while not generator.is_done():
        generator.generate_next_token()
    return np.stack([generator.get_sequence(i)[prompts.shape[1] :] for i in range(len(prompts))])


def test_onnxruntime_genai_runs_a_padded_batch_with_an_all_ones_mask(folder):
    og = pytest.importorskip("onnxruntime_genai")
    if og.__version__ != "0.18.0":
        pytest.skip(f"pins onnxruntime-genai 0.18.0's behaviour; {og.__version__} installed")
    prompts = np.array([[1, 2, 3, 4, 5], [0, 0, 7, 8, 9]])  # row 1 left-padded by 2
    real_mask = (np.arange(5) >= [[0], [2]]).astype(np.int64)
    steps = 6
    genai = _genai(folder, prompts, steps)
    session = _session(folder)
    as_padding, _ = onnx_greedy(session, prompts, real_mask, steps - 1, MAX_LENGTH)
    as_tokens, _ = onnx_greedy(session, prompts, np.ones_like(real_mask), steps - 1, MAX_LENGTH)
    alone = _genai(folder, prompts[1:, 2:], steps)
    np.testing.assert_array_equal(alone[0], as_padding[1])  # the file: the row alone
    np.testing.assert_array_equal(genai, as_tokens)  # og 0.18: the padding read as tokens
    assert not np.array_equal(genai[1], alone[0])
