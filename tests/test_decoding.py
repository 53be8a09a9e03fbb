"""Decoding with a key/value cache, against causal attention written by hand in float64.

The reference below projects, rotates (with its own statement of each scaling's
frequencies), attends and projects out in numpy float64; it shares no code with the
package. A prefill of several tokens and then one token per step must give the outputs
of the full causal pass, for multi-head and grouped-query attention, both layouts,
partial rotary, the scaling types, plain and left-padded batches, eagerly, in a
`tf.function` and under XLA.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tensorflow as tf
from float32_error import Bounded, assert_agree, assert_within, table

from keras_posenc import RotaryGroupQueryAttention, RotaryMultiHeadAttention

WIDTH, HEAD_DIM, QUERY_HEADS = 16, 8, 4
STEPS, PREFILL, MAX_LENGTH = 12, 3, 16
SWITCH = 6  # dynamic / longrope change frequencies past this total length, mid-generation
PAIRS = HEAD_DIM // 2


# --- the float64 reference -------------------------------------------------------------


def reference_omega(rope_dim: int, base: float, scaling: dict | None, total_length: int):
    """`(ω per pair, attention factor)` as transformers' `modeling_rope_utils.py` defines them."""
    pairs = rope_dim // 2
    plain = np.array([base ** (-2.0 * k / rope_dim) for k in range(pairs)])
    kind = None if scaling is None else scaling["rope_type"]
    if kind is None:
        return plain, 1.0
    if kind == "llama3":
        factor, low, high = (
            scaling["factor"],
            scaling["low_freq_factor"],
            scaling["high_freq_factor"],
        )
        original = scaling["original_max_position_embeddings"]
        out = []
        for w in plain:
            wavelength = 2 * math.pi / w
            if wavelength < original / high:
                out.append(w)
            elif wavelength > original / low:
                out.append(w / factor)
            else:
                smooth = (original / wavelength - low) / (high - low)
                out.append((1 - smooth) * w / factor + smooth * w)
        return np.array(out), 1.0
    if kind == "linear":
        return plain / scaling["factor"], 1.0
    if kind == "yarn":
        factor, original = scaling["factor"], scaling["original_max_position_embeddings"]

        def dim_for(rotations):
            return rope_dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(base))

        low, high = max(math.floor(dim_for(32)), 0), min(math.ceil(dim_for(1)), rope_dim - 1)
        high = high + 0.001 if low == high else high
        ramp = np.clip((np.arange(pairs) - low) / (high - low), 0.0, 1.0)
        return plain / factor * ramp + plain * (1 - ramp), 0.1 * math.log(factor) + 1.0
    if kind == "dynamic":
        factor, most = scaling["factor"], scaling["max_position_embeddings"]
        length = max(total_length, most)
        grown = base * (factor * length / most - (factor - 1)) ** (rope_dim / (rope_dim - 2))
        return np.array([grown ** (-2.0 * k / rope_dim) for k in range(pairs)]), 1.0
    assert kind == "longrope"
    original = scaling["original_max_position_embeddings"]
    factors = scaling["long_factor"] if total_length > original else scaling["short_factor"]
    factor = scaling["max_position_embeddings"] / original
    return plain / np.array(factors), math.sqrt(1 + math.log(factor) / math.log(original))


def reference_rotate(x, positions, omegas, factors, layout: str, rope_dim: int):
    """Rotate `x (batch, steps, heads, dim)`: row `b`, token `t` by `positions[b, t]·omegas[t]`."""
    x = x.copy()
    half = rope_dim // 2
    if layout == "half":
        first, second = np.arange(half), np.arange(half) + half
    else:
        first, second = np.arange(0, rope_dim, 2), np.arange(1, rope_dim, 2)
    angles = positions[:, :, None] * omegas[None, :, :]  # (batch, steps, pairs)
    cos = table((np.cos(angles) * factors[None, :, None])[:, :, None, :])
    sin = table((np.sin(angles) * factors[None, :, None])[:, :, None, :])
    a, b = x[..., first].copy(), x[..., second].copy()
    x[..., first] = a * cos - b * sin
    x[..., second] = b * cos + a * sin
    return x


def reference_attention(weights, x, positions, mask, lengths, kv_heads, rope):
    """Causal attention of every token over the real tokens up to it, float64, with its bound.

    Args:
        weights: the layer's `(query, key, value, output)` kernels and biases.
        x: `(batch, steps, width)` states; positions and mask: `(batch, steps)`.
        lengths: `(steps,)` total length each token was rotated for (it picks the
            frequencies of dynamic / longrope scaling).
        kv_heads: key/value heads; query head `h` reads key/value head `h // groups`.
        rope: `(layout, rope_dim, base, scaling)`.

    Returns:
        `(batch, steps, width)` outputs as `float32_error.Bounded`.
    """
    layout, rope_dim, base, scaling = rope
    (wq, bq), (wk, bk), (wv, bv), (wo, bo) = weights
    x = Bounded(x)
    q = np.einsum("btw,whd->bthd", x, wq) + bq
    k = np.einsum("btw,whd->bthd", x, wk) + bk
    v = np.einsum("btw,whd->bthd", x, wv) + bv
    per_token = [reference_omega(rope_dim, base, scaling, int(n)) for n in lengths]
    omegas = np.stack([o for o, _ in per_token])
    factors = np.array([f for _, f in per_token])
    rotated = slice(0, rope_dim)
    q[..., rotated] = reference_rotate(
        q[..., rotated], positions, omegas, factors, layout, rope_dim
    )
    k[..., rotated] = reference_rotate(
        k[..., rotated], positions, omegas, factors, layout, rope_dim
    )
    groups = QUERY_HEADS // kv_heads
    k, v = np.repeat(k, groups, axis=2), np.repeat(v, groups, axis=2)
    logits = np.einsum("bthd,bshd->bhts", q, k) / math.sqrt(HEAD_DIM)
    steps = x.shape[1]
    visible = np.tri(steps, dtype=bool)[None] & np.asarray(mask, bool)[:, None, :]
    # A padded query sees no real token: its row is not defined (NaN), and never compared.
    logits = np.where(visible[:, None], logits, -np.inf)
    with np.errstate(invalid="ignore"):
        scores = np.exp(logits - logits.max(axis=-1, keepdims=True))
    scores /= scores.sum(axis=-1, keepdims=True)
    context = np.einsum("bhts,bshd->bthd", scores, v)
    return np.einsum("bthd,hdw->btw", context, wo) + bo


# --- the cases ---------------------------------------------------------------------------

LLAMA3 = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8,
}
LINEAR = {"rope_type": "linear", "factor": 3.0}
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16}
DYNAMIC = {"rope_type": "dynamic", "factor": 2.0, "max_position_embeddings": SWITCH}
LONGROPE = {
    "rope_type": "longrope",
    "short_factor": [1.0 + 0.1 * k for k in range(PAIRS)],
    "long_factor": [1.0 + 3.0 * k for k in range(PAIRS)],
    "original_max_position_embeddings": SWITCH,
    "max_position_embeddings": 4 * SWITCH,
}


@dataclasses.dataclass(frozen=True)
class Case:
    kv_heads: int  # QUERY_HEADS: RotaryMultiHeadAttention; fewer: RotaryGroupQueryAttention
    layout: str = "half"
    rope_dim: int = HEAD_DIM
    scaling: dict | None = None
    padding: str = "none"  # "none", "mask" (positions_from_mask), "positions" (explicit)
    base: float = 10000.0

    @property
    def length_dependent(self) -> bool:
        return self.scaling is not None and self.scaling["rope_type"] in ("dynamic", "longrope")

    def layer(self):
        options = {
            "rope_layout": self.layout,
            "rope_dim": None if self.rope_dim == HEAD_DIM else self.rope_dim,
            "rope_scaling": self.scaling,
            "rope_max_wavelength": self.base,
            "positions_from_mask": self.padding == "mask",
        }
        if self.kv_heads == QUERY_HEADS:
            layer = RotaryMultiHeadAttention(QUERY_HEADS, HEAD_DIM, **options)
        else:
            layer = RotaryGroupQueryAttention(HEAD_DIM, QUERY_HEADS, self.kv_heads, **options)
        layer(np.zeros((1, 2, WIDTH), np.float32), np.zeros((1, 2, WIDTH), np.float32))
        rng = np.random.default_rng(3)
        # Non-zero biases too: a bias added after the rotation would show.
        layer.set_weights([rng.normal(0, 0.4, w.shape).astype(np.float32) for w in layer.weights])
        return layer

    def rope(self):
        return (self.layout, self.rope_dim, self.base, self.scaling)


CASES = {
    "mha-half": Case(QUERY_HEADS),
    "mha-interleaved-partial-padded": Case(
        QUERY_HEADS, "interleaved", rope_dim=4, padding="mask", base=500000.0
    ),
    "mha-longrope": Case(QUERY_HEADS, "interleaved", scaling=LONGROPE),
    "gqa-interleaved": Case(2, "interleaved"),
    "gqa-llama3-padded": Case(2, scaling=LLAMA3, padding="mask"),
    "gqa-partial-positions": Case(2, rope_dim=4, padding="positions"),
    "mha-linear": Case(QUERY_HEADS, scaling=LINEAR),
    "gqa-yarn-padded": Case(2, "interleaved", scaling=YARN, padding="mask"),
    "gqa-dynamic": Case(2, scaling=DYNAMIC),
    "gqa-dynamic-padded": Case(2, scaling=DYNAMIC, padding="mask"),
    "mqa-longrope-padded": Case(1, "interleaved", scaling=LONGROPE, padding="positions"),
}


def _weights(layer):
    def pair(dense):
        kernel = dense.kernel.numpy().astype(np.float64)
        return kernel, dense.bias.numpy().astype(np.float64)

    return [pair(d) for d in (layer._query_dense, layer._key_dense, layer._value_dense)] + [
        pair(layer._output_dense)
    ]


def _inputs(case: Case):
    rng = np.random.default_rng(11)
    x = rng.normal(size=(3, STEPS, WIDTH)).astype(np.float32)
    mask = np.ones((3, STEPS), bool)
    if case.padding != "none":
        mask[1, :4] = False  # left padding, reaching past the prefill
        mask[2, :1] = False
    return x, mask


def _call_lengths(positions):
    """The total length each token is rotated for: the largest position of its call, + 1."""
    calls = [range(PREFILL)] + [[t] for t in range(PREFILL, STEPS)]
    lengths = np.empty(STEPS, int)
    for call in calls:
        lengths[list(call)] = positions[:, list(call)].max() + 1
    return lengths


def _decode(case: Case, layer, in_mode, x, mask):
    """Prefill `PREFILL` tokens, then one token per step, through one (traced) call."""
    kv_heads = case.kv_heads
    signature = [
        tf.TensorSpec([None, None, WIDTH]),
        tf.TensorSpec([None, 2, MAX_LENGTH, kv_heads, HEAD_DIM]),
        tf.TensorSpec([], tf.int32),
        tf.TensorSpec([None, MAX_LENGTH], tf.bool),
        tf.TensorSpec([None, None], tf.int32),
    ]

    def step(tokens, cache, index, cache_mask, positions):
        extra = {"query_positions": positions} if case.padding == "positions" else {}
        if case.padding != "none":
            extra["cache_mask"] = cache_mask
        return layer(
            tokens,
            tokens,
            use_causal_mask=True,
            cache=cache,
            cache_update_index=index,
            **extra,
        )

    step = in_mode(step, signature)
    positions = np.maximum(np.cumsum(mask, axis=1) - 1, 0).astype(np.int32)
    cache_mask = np.ones((x.shape[0], MAX_LENGTH), bool)
    cache_mask[:, :STEPS] = mask
    cache = tf.zeros((x.shape[0], 2, MAX_LENGTH, kv_heads, HEAD_DIM))
    outputs = []
    for start, stop in [(0, PREFILL)] + [(t, t + 1) for t in range(PREFILL, STEPS)]:
        index = start if getattr(step, "python_function", None) is None else tf.constant(start)
        output, cache = step(
            tf.constant(x[:, start:stop]),
            cache,
            index,
            tf.constant(cache_mask),
            tf.constant(positions[:, start:stop]),
        )
        outputs.append(output.numpy())
    return np.concatenate(outputs, axis=1), cache.numpy()


@pytest.mark.parametrize("case", list(CASES.values()), ids=list(CASES))
def test_decoding_with_the_cache_equals_the_full_causal_pass(in_mode, case):
    layer = case.layer()
    x, mask = _inputs(case)
    positions = np.maximum(np.cumsum(mask, axis=1) - 1, 0)
    decoded, cache = _decode(case, layer, in_mode, x, mask)
    weights = _weights(layer)
    expected = reference_attention(
        weights, x, positions, mask, _call_lengths(positions), case.kv_heads, case.rope()
    )
    real = mask  # padded queries attend to nothing real: their rows are not defined
    assert_within(decoded, expected, where=real)

    # The full causal pass (no cache) gives the same outputs where the frequencies do not
    # depend on the total length; with dynamic / longrope it rotates every token for the
    # whole length, as transformers' full pass does.
    full_kwargs = {}
    if case.padding != "none":
        full_kwargs = {"query_mask": mask, "value_mask": mask}
    if case.padding == "positions":
        full_kwargs.update(query_positions=positions, key_positions=positions)
    full = layer(x, x, use_causal_mask=True, **full_kwargs).numpy()
    whole = np.full(STEPS, positions.max() + 1)
    expected_full = reference_attention(
        weights, x, positions, mask, whole, case.kv_heads, case.rope()
    )
    assert_within(full, expected_full, where=real)
    if case.length_dependent:
        assert np.abs(decoded[real] - full[real]).max() > 1e-3  # the switch really happened
    else:
        assert_agree(decoded, full, expected, where=real)

    # Each row of a left-padded batch decodes as that row alone (same total lengths).
    if case.padding != "none" and not case.length_dependent:
        for row in (1, 2):
            alone_x = x[row : row + 1, mask[row]]
            alone = layer(alone_x, alone_x, use_causal_mask=True).numpy()[0]
            assert_agree(decoded[row, mask[row]], alone, expected[row, mask[row]])

    # The cache holds the rotated keys and the values of every real token, nothing past.
    assert not cache[:, :, STEPS:].any()


# --- one compiled step ------------------------------------------------------------------

COMPILE_COUNT = textwrap.dedent(
    """
    import glob, json, os, sys
    import numpy as np
    import tensorflow as tf
    from keras_posenc import RotaryGroupQueryAttention

    layer = RotaryGroupQueryAttention(
        8, 4, 2, rope_scaling={scaling}, positions_from_mask={from_mask}
    )
    batch, max_length, steps = 2, 40, 30
    layer.build((batch, None, 16), (batch, None, 16))  # no variables made while tracing

    @tf.function(
        jit_compile=True,
        input_signature=[
            tf.TensorSpec([batch, None, 16]),
            tf.TensorSpec([batch, 2, max_length, 2, 8]),
            tf.TensorSpec([], tf.int32),
            tf.TensorSpec([batch, max_length], tf.bool),
        ],
    )
    def decode_step(tokens, cache, index, mask):
        return layer(
            tokens,
            tokens,
            use_causal_mask=True,
            cache=cache,
            cache_update_index=index,
            cache_mask=mask if {from_mask} else None,
        )

    x = np.random.default_rng(0).normal(size=(batch, steps, 16)).astype(np.float32)
    mask = tf.constant(np.arange(max_length)[None] >= np.array([[0], [3]]))  # row 1: padded
    cache = tf.zeros((batch, 2, max_length, 2, 8))
    _, cache = decode_step(x[:, :4], cache, tf.constant(0), mask)  # prefill
    dumps = os.path.join(sys.argv[1], "*decode_step*before_optimizations.txt")
    after_prefill = len(glob.glob(dumps))
    for t in range(4, steps):
        _, cache = decode_step(x[:, t : t + 1], cache, tf.constant(t), mask)
    compiled = len(glob.glob(dumps))
    print(json.dumps([decode_step.experimental_get_tracing_count(), after_prefill, compiled]))
    """
)


@pytest.mark.parametrize(
    "scaling, from_mask", [(None, False), (DYNAMIC, True)], ids=["plain", "dynamic-padded"]
)
def test_one_compiled_step_serves_the_whole_generation(tmp_path, scaling, from_mask):
    """Prefill and 26 decode steps: one trace; one XLA compilation per token count (4, 1)."""
    environment = {
        **os.environ,
        "KERAS_BACKEND": "tensorflow",
        "TF_CPP_MIN_LOG_LEVEL": "3",
        "XLA_FLAGS": f"--xla_dump_to={tmp_path} --xla_dump_hlo_as_text",
    }
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            COMPILE_COUNT.replace("{scaling}", repr(scaling)).replace(
                "{from_mask}", str(from_mask)
            ),
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        env=environment,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    traces, after_prefill, compiled = json.loads(result.stdout.strip().splitlines()[-1])
    assert traces == 1
    assert after_prefill == 1
    assert compiled == 2  # the prefill's shape and the decode step's: never a new position


# --- bad caches ---------------------------------------------------------------------------


def test_a_cache_of_the_wrong_shape_or_a_missing_index_is_an_error():
    layer = RotaryGroupQueryAttention(HEAD_DIM, QUERY_HEADS, 2)
    x = np.zeros((1, 1, WIDTH), np.float32)
    with pytest.raises(ValueError, match=r"\(batch, 2, max_length, 2, 8\), got \(1, 2, 8, 4, 8\)"):
        layer(x, x, cache=np.zeros((1, 2, 8, 4, 8), np.float32), cache_update_index=0)
    cache = np.zeros((1, 2, 8, 2, 8), np.float32)
    with pytest.raises(ValueError, match="needs cache_update_index"):
        layer(x, x, cache=cache)
    with pytest.raises(ValueError, match=r"cache_update_index=8 with 1 new tokens does not fit"):
        layer(x, x, cache=cache, cache_update_index=8)
    with pytest.raises(ValueError, match="need a `cache`"):
        layer(x, x, cache_update_index=0)
    with pytest.raises(ValueError, match="give their padding as cache_mask"):
        layer(x, x, value_mask=np.ones((1, 1), bool), cache=cache, cache_update_index=0)
    with pytest.raises(ValueError, match="key_dim=8 and value_dim=4"):
        mha = RotaryMultiHeadAttention(2, 8, value_dim=4)
        mha(x, x, cache=np.zeros((1, 2, 8, 2, 8), np.float32), cache_update_index=0)


def test_an_index_past_the_cache_is_nan_under_xla_not_a_clamped_answer():
    layer = RotaryGroupQueryAttention(HEAD_DIM, QUERY_HEADS, 2)
    x = tf.ones((1, 1, WIDTH))
    cache = tf.zeros((1, 2, 8, 2, 8))
    step = tf.function(
        lambda index: layer(x, x, cache=cache, cache_update_index=index), jit_compile=True
    )
    output, _ = step(tf.constant(7))
    assert np.isfinite(output.numpy()).all()
    for index in (8, 100, -1):
        output, _ = step(tf.constant(index))
        assert np.isnan(output.numpy()).all(), index
    graph = tf.function(lambda index: layer(x, x, cache=cache, cache_update_index=index))
    with pytest.raises(tf.errors.InvalidArgumentError, match="must stay within the cache"):
        graph(tf.constant(8))
