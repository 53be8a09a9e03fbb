"""keras.distribution on JAX: a tiny RoPE encoder and decoder train on 8 devices as on one.

Runs only in the process tests/test_backends_distribution.py starts, with
`XLA_FLAGS=--xla_force_host_platform_device_count=8` set before JAX was imported (the
flag is read once, when JAX starts); in the plain backend runs of tests/test_backends.py
it is skipped (issue #28). The models: `tiny_encoder.py` (token embedding, the sinusoidal
and learned position layers, a self-attention with `RotaryEmbedding` on its queries and
keys) and `tiny_decoder.py` (two `DecoderBlock`s: grouped-query RoPE attention, SwiGLU).

`DataParallel` (8-way batch) and `ModelParallel` (a 2x4 mesh: batch 2-way, the tables,
embeddings, attention and MLP kernels 4-way) train each, from the same start, to the
one-device losses and weights. The ModelParallel models are also saved as `.keras` with
their outputs on probes, for the TensorFlow process to load and export
(`serve_on_tensorflow.py`).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import keras
import numpy as np
import pytest

DEVICES = 8
if keras.backend.backend() != "jax" or os.environ.get("POSENC_DISTRIBUTION") != "1":
    pytest.skip(
        "run by tests/test_backends_distribution.py with 8 virtual CPU devices",
        allow_module_level=True,
    )

import jax  # noqa: E402
import tiny_decoder  # noqa: E402
import tiny_encoder  # noqa: E402
from jax.sharding import PartitionSpec  # noqa: E402

EPOCHS = 2
BATCH = 16
# Sharding reorders float32 sums (the gradient all-reduce over the batch, the partial
# sums of a kernel contraction split over devices). The largest reduction split here sums
# BATCH x LENGTH = 256 terms of size <= 1: reordering it moves the result by at most
# gamma_256 = 256 * 2^-24 ~ 1.5e-5 of the sum of magnitudes (worst case, any order;
# measured: 2.4e-7 on the losses, 9e-8 on the weights). A wrong sharding, a dropped
# shard or an unsynchronised replica moves them by 1e-3 and more.
TOLERANCE = 1.5e-5

# What the LayoutMap shards (regexes that match a variable's whole path, as LayoutMap
# matches them), and along which mesh axis.
LAYOUTS = {
    "encoder": {
        "tokens_embedding/embeddings": (None, "model"),
        "learned/embeddings": (None, "model"),
        "attention/(query|key|value)/kernel": (None, "model", None),
        "attention/out/kernel": ("model", None, None),
        "classifier/kernel": (None, "model"),
    },
    # keras.layers.GroupQueryAttention's kernels: (width, heads, head_dim) for the
    # projections, (heads, head_dim, width) for the output; the heads split 4-way.
    "decoder": {
        "tokens_embedding/embeddings": (None, "model"),
        "block_\\d/attention/(query|key|value)/kernel": (None, "model", None),
        "block_\\d/attention/attention_output/kernel": ("model", None, None),
        "block_\\d/(gate|up)/kernel": (None, "model"),
        "block_\\d/down/kernel": ("model", None),
        "head/kernel": (None, "model"),
    },
}
SHARDED = {"encoder": 7, "decoder": 1 + 2 * 7 + 1}  # the variables LAYOUTS splits


def _model_parallel(kind: str) -> keras.distribution.ModelParallel:
    mesh = keras.distribution.DeviceMesh((2, 4), ["batch", "model"], jax.devices())
    layout_map = keras.distribution.LayoutMap(mesh)
    for path, axes in LAYOUTS[kind].items():
        layout_map[path] = axes
    return keras.distribution.ModelParallel(layout_map=layout_map, batch_dim_name="batch")


def _build(kind: str) -> tuple[keras.Model, keras.Model | None]:
    """`(training model, decode-step model or None)`."""
    if kind == "encoder":
        return tiny_encoder.build(), None
    return tiny_decoder.build()


def _train(kind: str, distribution, initial=None) -> dict:
    module = tiny_encoder if kind == "encoder" else tiny_decoder
    tokens, labels = module.data()
    keras.utils.set_random_seed(7)
    scope = distribution.scope() if distribution is not None else contextlib.nullcontext()
    with scope:
        model, step = _build(kind)
        if initial is not None:
            model.set_weights(initial)
        start = [np.asarray(w) for w in model.weights]
        module.compile_for_training(model)
        history = model.fit(
            tokens, labels, batch_size=BATCH, epochs=EPOCHS, shuffle=False, verbose=0
        )
    return {
        "model": model,
        "step": step,
        "start": start,
        "losses": history.history["loss"],
        "weights": [np.asarray(w) for w in model.weights],
    }


@pytest.fixture(scope="module", params=["encoder", "decoder"])
def runs(request) -> dict:
    assert len(jax.devices()) == DEVICES, "XLA_FLAGS did not give 8 CPU devices"
    kind = request.param
    one = _train(kind, None)
    return {
        "kind": kind,
        "one": one,
        "data": _train(kind, keras.distribution.DataParallel(devices=jax.devices()), one["start"]),
        "model": _train(kind, _model_parallel(kind), one["start"]),
    }


def test_one_device_trains(runs):
    one = runs["one"]
    # No distribution: every weight on one device, though 8 are there.
    assert all(len(v.value.devices()) == 1 for v in one["model"].weights)
    assert one["losses"][-1] < 0.95 * one["losses"][0]
    change = max(np.max(np.abs(a - b)) for a, b in zip(one["start"], one["weights"], strict=True))
    # Equality within TOLERANCE means something only if training moves the weights more.
    assert change > 100 * TOLERANCE


@pytest.mark.parametrize("kind", ["data", "model"])
def test_distributed_training_equals_one_device(runs, kind):
    one, run = runs["one"], runs[kind]
    np.testing.assert_allclose(run["losses"], one["losses"], rtol=TOLERANCE, atol=0)
    for variable, a, b in zip(run["model"].weights, run["weights"], one["weights"], strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=TOLERANCE, err_msg=variable.path)


def _layout_of(kind: str, path: str) -> tuple:
    import re

    matches = [axes for pattern, axes in LAYOUTS[kind].items() if re.fullmatch(pattern, path)]
    assert len(matches) <= 1, path
    return matches[0] if matches else ()


def test_model_parallel_shards_weights_as_the_layout_map_says(runs):
    sharded = 0
    for variable in runs["model"]["model"].weights:
        array = variable.value
        axes = _layout_of(runs["kind"], variable.path)
        expected = PartitionSpec(*axes) if axes else PartitionSpec()
        # Trailing unsharded axes may be left out of a PartitionSpec: compare padded.
        spec = tuple(array.sharding.spec) + (None,) * (array.ndim - len(array.sharding.spec))
        assert spec == tuple(expected) + (None,) * (array.ndim - len(expected)), variable.path
        shards = array.addressable_shards
        assert len({shard.device for shard in shards}) == DEVICES
        shape = tuple(size // 4 if axis == "model" else size for size, axis in _padded(array, axes))
        assert all(shard.data.shape == shape for shard in shards), variable.path
        sharded += "model" in axes
    assert sharded == SHARDED[runs["kind"]]


def _padded(array, axes):
    return zip(array.shape, tuple(axes) + (None,) * (array.ndim - len(axes)), strict=True)


def test_data_parallel_replicates_weights_and_splits_the_batch(runs):
    distribution = keras.distribution.DataParallel(devices=jax.devices())
    assert distribution.get_data_layout((BATCH, 16)).axes == ("batch", None)
    for variable in runs["data"]["model"].weights:
        assert all(axis is None for axis in variable.value.sharding.spec), variable.path
        assert len(variable.value.addressable_shards) == DEVICES


def test_save_for_tensorflow(runs):
    """Writes the ModelParallel-trained models and their outputs for serve_on_tensorflow.py."""
    folder = os.environ.get("POSENC_SERVE_DIR")
    if not folder:
        pytest.skip("POSENC_SERVE_DIR not set")
    folder = Path(folder)
    (folder / "jax_version.txt").write_text(jax.__version__)
    if runs["kind"] == "decoder":
        step = runs["model"]["step"]
        step.save(folder / "decoder_step.keras")
        # One compiled step per token count (the prefill, then one token a step).
        compiled = jax.jit(lambda inputs: step(inputs))
        np.savez(folder / "jax_decoder_outputs.npz", **tiny_decoder.greedy_probe(compiled))
        return
    model = runs["model"]["model"]
    model.save(folder / "trained.keras")
    # Lengths other than the training one, up to the learned table.
    rng = np.random.default_rng(1)
    probes = {
        f"tokens_{length}": rng.integers(0, tiny_encoder.VOCABULARY, (3, length)).astype("int32")
        for length in (5, tiny_encoder.LENGTH, tiny_encoder.MAX_LENGTH)
    }
    # One compiled call per length (eager JAX compiles each op per shape: slower).
    forward = jax.jit(lambda tokens: model(tokens))
    outputs = {
        name.replace("tokens", "logits"): np.asarray(forward(x)) for name, x in probes.items()
    }
    np.savez(folder / "jax_outputs.npz", **probes, **outputs)
    # Keras's own export from JAX (jax2tf): a dynamic batch works, a dynamic sequence axis
    # does not (docs/backends.md), so the signature fixes the length.
    signature = [keras.InputSpec(shape=(None, tiny_encoder.LENGTH), dtype="int32")]
    model.export(folder / "keras_export", format="tf_saved_model", input_signature=signature)
