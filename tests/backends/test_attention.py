"""The attention layers under KERAS_BACKEND=jax / torch: TensorFlow's results, float64 references.

Run by tests/test_backends.py in a process per backend, with POSENC_TF_RESULTS naming the
TensorFlow outputs of every case (`attention_cases.py`, stored as `attention:<case>:<output>`).
Each case's outputs must agree with TensorFlow's eagerly (torch: every case; JAX: most
cases without a cache, one with one and the decoder, as JAX compiles every eager op once
per shape: `JAX_JIT_ONLY`, `JAX_BOTH`) and, under
JAX, inside `jax.jit` with the cache, its update index, the masks and positions traced:
a decode step compiles once per token count. Where a float64 formula is short to write
(`tests/reference.py`, `tests/decoder_reference.py`) the outputs are also held to it.
"""

from __future__ import annotations

import functools
import os

import attention_cases as ac
import keras
import numpy as np
import pytest
import reference
from decoder_reference import ReferenceDecoder
from float32_error import assert_within

from keras_posenc.backend import keras_private as private

BACKEND = keras.backend.backend()
# Different float32 summation orders: a few ulps of the largest output, times the ~8-term
# sums and the softmax they pass through (measured: 5e-7 of it, 2.5e-6 for the decoder).
FLOAT32 = 2e-5
# bfloat16 / float16 outputs (8 / 11 significant bits) each round their own matmuls.
NARROW = {"mixed_bfloat16": 5e-2, "mixed_float16": 4e-3}
# Under JAX, eager calls cost a compilation per op and shape: some cases run there under
# `jax.jit` only (torch runs them eagerly): mixed precision, dynamic NTK, cross-attention.
JAX_JIT_ONLY = (
    "mha_cross_masks_positions_scores",
    "mha_dynamic_start_attention_mask",
    "gqa_bfloat16",
    "mha_float16_scores",
)
# Under JAX both eagerly and under `jax.jit` (the other cases with a cache: jitted only).
JAX_BOTH = ("gqa_cache_left_padded", "decoder")
# Without a cache, under `jax.jit` too: padding masks traced into positions and chunks.
JAX_JIT_PLAIN = (*JAX_JIT_ONLY, "gqa_padded_chunked_tempered_l2")


@functools.cache
def _run(name: str, jit: bool = False) -> dict:
    """`attention_cases.run`, once per case and mode in this process (the references and
    the jit-against-eager test read the same outputs as the comparisons with TensorFlow)."""
    return ac.run(name, jit)


def _eager_cases() -> list[str]:
    if BACKEND != "jax":
        return list(ac.CASES)
    plain = [n for n, case in ac.CASES.items() if case["kind"] == "plain"]
    return [n for n in plain if n not in JAX_JIT_ONLY] + list(JAX_BOTH)


def _jit_cases() -> list[str]:
    return [n for n, case in ac.CASES.items() if case["kind"] != "plain" or n in JAX_JIT_PLAIN]


def _outputs(name: str) -> dict:
    """The case's outputs as this backend computes them (eagerly, or under `jax.jit` for
    the cases JAX runs only so): what the float64 references check."""
    return _run(name, jit=name not in _eager_cases())


@pytest.fixture(scope="module")
def tf_results():
    stored = np.load(os.environ["POSENC_TF_RESULTS"])
    results = {}
    for key in stored.files:
        if key.startswith("attention:"):
            _, name, output = key.split(":")
            results.setdefault(name, {})[output] = stored[key]
    return results


def _agree(actual: dict, expected: dict, name: str, what: str) -> None:
    """Every output of `expected` in `actual`, within the case's tolerance of its scale."""
    dtype = ac.CASES[name].get("arguments", {}).get("dtype", "")
    relative = NARROW.get(dtype, FLOAT32)
    for output, want in expected.items():
        got = actual[output]
        assert got.shape == want.shape, (name, output, got.shape, want.shape)
        if output in ("output", "logits"):  # (batch, queries, ...): not the padding queries
            padding = ac.padding_queries(name, got.shape[1])
            assert np.all(np.isfinite(got[padding])), (name, output, "padding queries")
            got, want = got[~padding], want[~padding]
        scale = max(1.0, float(np.max(np.abs(want))))
        error = np.abs(got - want)
        assert np.all(error <= relative * scale), (
            f"{name} {output} against {what}: error {np.nanmax(error):.3g}, "
            f"allowed {relative * scale:.3g}"
        )
        if dtype:  # most values round alike: a wrong row would move them all
            assert np.mean(error) <= relative * scale / 8, (name, output, np.mean(error))


@pytest.mark.parametrize("name", _eager_cases())
def test_eager_gives_tensorflows_results(name, tf_results):
    _agree(_run(name), tf_results[name], name, "TensorFlow")


@pytest.mark.skipif(BACKEND != "jax", reason="jax.jit")
@pytest.mark.parametrize("name", _jit_cases())
def test_jit_gives_tensorflows_results_and_compiles_once_per_token_count(name, tf_results):
    results = dict(_run(name, jit=True))
    if ac.CASES[name]["kind"] != "plain":
        # One compilation per distinct token count (the prefill, the decode steps), however
        # many steps and whatever their cache_update_index: the index is traced.
        assert results.pop("compilations") == len(set(ac.CASES[name]["splits"]))
    expected = {key: value for key, value in tf_results[name].items() if key in results}
    _agree(results, expected, name, "TensorFlow")


@pytest.mark.skipif(BACKEND != "jax", reason="jax.jit")
@pytest.mark.parametrize("name", JAX_BOTH)
def test_jitted_decode_is_the_eager_decode(name):
    eager, jitted = _run(name), _run(name, jit=True)
    # XLA fuses the rotation, the norms and the softmax's sums: a few roundings apart, in
    # ulps of the largest output (measured: 1.6 for the attention layers; 4.6 for the
    # decoder's logits, after its norms, MLP and head).
    ulps = 16 if ac.CASES[name]["kind"] == "decoder" else 4
    for output in jitted.keys() - {"compilations"}:
        ulp = float(np.max(np.abs(eager[output]))) * 2**-23
        np.testing.assert_allclose(jitted[output], eager[output], rtol=0, atol=ulps * ulp)


# --------------------------------------------------------------------------------------
# float64 references


def _weights(layer) -> dict:
    """The projections as `reference.multi_head_attention` takes them; key/value heads
    repeated for their query groups (grouped-query attention is multi-head attention with
    shared key/value kernels)."""
    heads, kv_heads, _, _ = layer._head_counts()
    weights = {}
    for name, part in [("query", "query"), ("key", "key"), ("value", "value")]:
        dense = private.attention_part(layer, f"{part}_dense")
        for kind in ("kernel", "bias"):
            weight = getattr(dense, kind, None)
            if weight is not None:
                array = keras.ops.convert_to_numpy(weight).astype(np.float64)
                if name != "query":
                    array = np.repeat(array, heads // kv_heads, axis=-2)
                weights[f"{name}_{kind}"] = array
    output = private.attention_part(layer, "output_dense")
    weights["output_kernel"] = keras.ops.convert_to_numpy(output.kernel).astype(np.float64)
    if output.bias is not None:
        weights["output_bias"] = keras.ops.convert_to_numpy(output.bias).astype(np.float64)
    return weights


def _reference(layer, query, value, key, positions, mask):
    rope = layer.rotary_embedding
    rotation = {"max_wavelength": rope.max_wavelength, "layout": rope.layout}
    rotation["rotary_dim"] = rope.rotary_dim

    def rotate(projected, which):
        return reference.rotary(projected, positions[which], **rotation)

    return reference.multi_head_attention(
        query, value, _weights(layer), key=key, rotate=rotate, attention_mask=mask
    )


def _causal(length: int) -> np.ndarray:
    return np.tri(length, dtype=bool)[None]


def test_causal_self_attention_is_the_float64_formula():
    name = "mha_causal_partial"
    layer = ac.build(name)
    x = ac.tokens(name, ac.CASES[name]["query"])
    positions = np.arange(x.shape[1])
    expected, _ = _reference(
        layer, x, x, None, {"query": positions, "key": positions}, np.repeat(_causal(8), 2, 0)
    )
    assert_within(_outputs(name)["output"], expected)


def test_masked_cross_attention_at_positions_is_the_float64_formula():
    name = "mha_cross_masks_positions_scores"
    case = ac.CASES[name]
    layer = ac.build(name)
    query, value, key = (ac.tokens(name, case[part]) for part in ("query", "value", "key"))
    call = case["call"]
    mask = call["query_mask"].astype(bool)[:, :, None] & call["value_mask"].astype(bool)[:, None]
    mask &= call["key_mask"][:, None]
    positions = {"query": call["query_positions"], "key": call["key_positions"]}
    expected, expected_scores = _reference(layer, query, value, key, positions, mask)
    results = _outputs(name)
    real = np.broadcast_to(call["query_mask"].astype(bool)[:, :, None], expected.shape)
    assert_within(results["output"], expected, where=real)
    real_scores = np.broadcast_to(
        call["query_mask"].astype(bool)[:, None, :, None], expected_scores.shape
    )
    assert_within(results["scores"], expected_scores, where=real_scores)


def test_left_padded_cached_decode_is_the_float64_formula():
    """Prefill and decode steps into a cache, left padded: each row's outputs are attention
    over its real tokens at positions 0, 1, ... (the full causal pass, padding masked)."""
    name = "gqa_cache_left_padded"
    layer = ac.build(name)
    length = sum(ac.CASES[name]["splits"])
    x = ac.tokens(name, (2, length, ac.WIDTH))
    real = ac.cache_mask(name)[:, :length].astype(bool)
    positions = np.maximum(np.cumsum(real, axis=1) - 1, 0)
    mask = _causal(length) & real[:, None, :]
    expected, _ = _reference(layer, x, x, None, {"query": positions, "key": positions}, mask)
    where = np.broadcast_to(real[:, :, None], expected.shape)
    assert_within(_outputs(name)["output"], expected, where=where)


def test_decoder_step_is_the_float64_decoder():
    """`decoder_models`' step model, prefill (left padded) and decode steps, against
    tests/decoder_reference.py run on each row's real tokens alone."""
    name = "decoder"
    _, step = ac.decoder(ac.MAX_LENGTH)
    ids = ac.token_ids(name)
    logits = _outputs(name)["logits"]
    pads = ac.CASES[name]["padding"]
    for row, pad in enumerate(pads):
        expected = ReferenceDecoder(step).step(ids[row, pad:])
        np.testing.assert_allclose(
            logits[row, pad:], expected, rtol=0, atol=FLOAT32 * np.abs(expected).max()
        )
