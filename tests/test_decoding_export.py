"""An exported decode step: SavedModel and ONNX verified, and a greedy loop in onnxruntime alone.

The step model takes token ids, the cache `(batch, 2, max_length, kv_heads, head_dim)`,
`cache_update_index` and optionally a padding mask over the cache's slots, and returns
logits and the updated cache. onnxruntime, fed its own cache back for 64 steps after a
prefill, must pick the tokens Keras picks, with logits within the package's own decoder
tolerance `1e-5 + 1e-4·rms(row)` (`keras_posenc/export/decoder/check.py`: optimum's and
transformers' ONNX validation, relative to the row's RMS).
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf
from float32_error import assert_within_bound

from keras_posenc import RotaryGroupQueryAttention
from keras_posenc.export import save_onnx, save_saved_model, verify_export
from keras_posenc.export.decoder.logit_tolerance import bound as logit_bound
from keras_posenc.export.verify.runtimes import onnx_session

VOCABULARY, WIDTH, HEAD_DIM, QUERY_HEADS, KV_HEADS = 32, 32, 8, 4, 2
MAX_LENGTH, PROMPT, STEPS = 80, 6, 64
LLAMA3 = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 16,
}


def decode_step_model(padded: bool) -> keras.Model:
    ids = keras.Input((None,), dtype="int32", name="token_ids")
    cache = keras.Input((2, MAX_LENGTH, KV_HEADS, HEAD_DIM), name="cache")
    index = keras.Input(batch_shape=(), dtype="int32", name="cache_update_index")
    inputs = [ids, cache, index]
    extra = {}
    if padded:
        extra["cache_mask"] = keras.Input((MAX_LENGTH,), dtype="int32", name="padding_mask")
        inputs.append(extra["cache_mask"])
    # Unit-scale embeddings: attention far from uniform, so a wrong position shows.
    x = keras.layers.Embedding(VOCABULARY, WIDTH, embeddings_initializer="normal")(ids)
    attention = RotaryGroupQueryAttention(
        HEAD_DIM,
        QUERY_HEADS,
        KV_HEADS,
        rope_scaling=LLAMA3,
        rope_layout="interleaved",
        positions_from_mask=padded,
        kernel_initializer=keras.initializers.RandomNormal(stddev=0.5),
    )
    attended, next_cache = attention(
        x, x, use_causal_mask=True, cache=cache, cache_update_index=index, **extra
    )
    logits = keras.layers.Dense(VOCABULARY, name="head")(
        keras.layers.RMSNormalization()(x + attended)
    )
    outputs = {
        "logits": keras.layers.Identity(name="logits")(logits),
        "next_cache": keras.layers.Identity(name="next_cache")(next_cache),
    }
    return keras.Model(inputs, outputs)


def greedy(step, prompts, mask, padded: bool):
    """Prefill the prompt in one call, then `STEPS` tokens one by one; tokens and logits."""
    batch = prompts.shape[0]
    padding = np.ones((batch, MAX_LENGTH), np.int32)
    padding[:, : prompts.shape[1]] = mask
    cache = np.zeros((batch, 2, MAX_LENGTH, KV_HEADS, HEAD_DIM), np.float32)
    tokens, logits = [], []
    ids, index = prompts, 0
    for _ in range(STEPS):
        feeds = {"token_ids": ids, "cache": cache, "cache_update_index": np.array(index, np.int32)}
        if padded:
            feeds["padding_mask"] = padding
        out_logits, cache = step(feeds)
        index += ids.shape[1]
        logits.append(np.asarray(out_logits)[:, -1])
        tokens.append(np.argmax(logits[-1], axis=-1).astype(np.int32))
        ids = tokens[-1][:, None]
    return np.stack(tokens, 1), np.stack(logits, 1)


def _prompts(padded: bool):
    rng = np.random.default_rng(5)
    prompts = rng.integers(1, VOCABULARY, (3, PROMPT)).astype(np.int32)
    mask = np.ones_like(prompts)
    if padded:
        mask[1, :2] = mask[2, :5] = 0
        prompts[mask == 0] = 0
    return prompts, mask


@pytest.mark.parametrize("padded", [False, True], ids=["plain", "left-padded"])
def test_exported_decode_step_verifies_and_generates_like_keras(tmp_path, padded):
    keras.utils.set_random_seed(2)
    model = decode_step_model(padded)
    saved, onnx_path = tmp_path / "saved_model", tmp_path / "step.onnx"
    save_saved_model(model, saved)
    save_onnx(model, onnx_path)

    session = onnx_session(onnx_path)
    shapes = {i.name: i.shape for i in session.get_inputs()}
    # The cache's fixed axes keep their sizes; batch and the new tokens stay dynamic.
    assert shapes["cache"][1:] == [2, MAX_LENGTH, KV_HEADS, HEAD_DIM]
    assert isinstance(shapes["cache"][0], str) and isinstance(shapes["token_ids"][1], str)

    def make_inputs(batch, sequence):
        rng = np.random.default_rng([batch, sequence])
        feeds = {
            "token_ids": rng.integers(0, VOCABULARY, (batch, sequence)).astype(np.int32),
            "cache": rng.normal(size=(batch, 2, MAX_LENGTH, KV_HEADS, HEAD_DIM)).astype("f4"),
            "cache_update_index": np.array(max(MAX_LENGTH - sequence - 1, 0), np.int32),
        }
        if padded:
            feeds["padding_mask"] = (rng.random((batch, MAX_LENGTH)) < 0.8).astype(np.int32)
        return feeds

    report = verify_export(
        model,
        saved,
        onnx_path,
        batch_sizes=(1, 3),
        sequence_lengths=(1, 5),
        make_inputs=make_inputs,
        repeats=1,
    )
    assert report["passed"], report["summary"]

    # An index past the cache: NaN from onnxruntime (ONNX has no assertions), an error
    # naming it from the SavedModel; never a clamped, plausible answer.
    past = {**make_inputs(1, 1), "cache_update_index": np.array(MAX_LENGTH, np.int32)}
    logits, _ = session.run(["logits", "next_cache"], past)
    assert np.isnan(logits).all()
    serve = tf.saved_model.load(str(saved)).signatures["serving_default"]
    with pytest.raises(tf.errors.InvalidArgumentError, match="must stay within the cache"):
        serve(**{name: tf.constant(value) for name, value in past.items()})

    prompts, mask = _prompts(padded)

    def keras_step(feeds):
        outputs = model(feeds)
        return outputs["logits"].numpy(), outputs["next_cache"].numpy()

    def onnx_step(feeds):
        return session.run(["logits", "next_cache"], feeds)

    keras_tokens, keras_logits = greedy(keras_step, prompts, mask, padded)
    onnx_tokens, onnx_logits = greedy(onnx_step, prompts, mask, padded)
    np.testing.assert_array_equal(onnx_tokens, keras_tokens)
    assert_within_bound(onnx_logits, keras_logits, logit_bound(keras_logits), what="onnx")
    assert len(np.unique(keras_tokens)) > 3  # not a constant answer

    if padded:
        # Each left-padded row generates what it generates alone, unpadded.
        for row in (1, 2):
            alone = prompts[row : row + 1, mask[row].astype(bool)]
            tokens, logits = greedy(onnx_step, alone, np.ones_like(alone), padded)
            np.testing.assert_array_equal(tokens[0], onnx_tokens[row])
            bound = logit_bound(onnx_logits[row])
            assert_within_bound(logits[0], onnx_logits[row], bound, what=f"row {row} alone")
