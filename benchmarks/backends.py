"""`python -m benchmarks --backend jax` (or `torch`): the layers on another Keras backend.

The shapes of `candidates.PLAN`, each from the Python int start 0, a runtime int32 start
(7, or 0 for 4096-long sequences: an argument of the compiled function, as in decoding)
and, where the plan says so, a runtime start of 5000 past the cached rows (†: reported, not
held to the floor). Candidates, as in the TensorFlow benchmark:

- `floor`: `x + c`; for rotary `x·C + swap(x)·S` on constant rows (float64 from
  `tests/reference.py`, rounded once), the faster of two swaps (a concat of the halves, a
  reshape and a flip) in each row, taken per row after the rounds;
- `ours`: `SinusoidalPositionalEncoding()`, `RotaryEmbedding()`, `LearnedPositionalEmbedding(1024)`;
- `keras_hub`: `x + SinePositionEncoding()(x)`, `RotaryEmbedding()`, `x + PositionEmbedding(1024)`
  (holding our learned table), on the same backend;
- `control`: the floor again, in the same form (its ratio to the floor is the row's noise).

Under JAX every candidate is `jax.jit`-compiled (x an argument, never a folded constant) and
synchronised with `block_until_ready`; under torch the calls are eager (on a GPU, where
torch has one, synchronised with `torch.cuda.synchronize`). Rounds are
interleaved and shuffled as `benchmarks.timing` runs them; the table holds medians (ms) and
the ratios of the medians.
"""

from __future__ import annotations

import statistics
import time

import keras
import numpy as np
from keras import ops

from benchmarks import candidates, reference, timing

MAX_WAVELENGTH = candidates.MAX_WAVELENGTH


class _Synced:
    """A finished result, in the form `timing` waits on (`._numpy()`)."""

    def __init__(self, value):
        if hasattr(value, "block_until_ready"):
            value.block_until_ready()
        elif getattr(getattr(value, "device", None), "type", None) == "cuda":
            import torch

            torch.cuda.synchronize()
        self.value = value

    def _numpy(self):
        return self.value


def _compiled(body, x, start, tensor_start: bool):
    """`body(x, start)` as a call without arguments: `jax.jit` with `x` (and a tensor
    start) as arguments under JAX, eager under torch."""
    if keras.backend.backend() == "jax":
        import jax

        if tensor_start:
            # On the device already, as a decoding loop keeps its index: a numpy scalar
            # would be copied there at every call (on a GPU, ~0.1 ms: docs/gpu.md).
            function, start = jax.jit(body), jax.device_put(np.int32(start))
            return lambda: _Synced(function(x, start))
        function = jax.jit(lambda inputs: body(inputs, start))
        return lambda: _Synced(function(x))
    if tensor_start:
        start = ops.convert_to_tensor(start, "int32")
    return lambda: _Synced(body(x, start))


def _floors(layer: str, shape, positions, rows=None) -> dict:
    if layer != "rotary":
        constant = ops.convert_to_tensor(rows.astype(np.float32))
        return {"floor": lambda x, start: x + constant}
    theta = reference.angles(positions, shape[-1], MAX_WAVELENGTH)
    theta = theta.reshape(theta.shape[:1] + (1,) * (len(shape) - 3) + theta.shape[1:])
    big_c = ops.convert_to_tensor(np.tile(np.cos(theta), 2).astype(np.float32))
    big_s = np.concatenate([-np.sin(theta), np.sin(theta)], -1)
    big_s = ops.convert_to_tensor(big_s.astype(np.float32))
    half, paired = shape[-1] // 2, (*shape[:-1], 2, shape[-1] // 2)

    def concat(x, start):
        return x * big_c + ops.concatenate([x[..., half:], x[..., :half]], -1) * big_s

    def flip(x, start):
        return x * big_c + ops.reshape(ops.flip(ops.reshape(x, paired), -2), shape) * big_s

    return {"floor": concat, "floor_flip": flip}


def _body(layer, add_inputs: bool = False):
    def body(x, start):
        outputs = layer(x, start_index=start)
        return x + outputs if add_inputs else outputs

    return body


def _rows(selected, hub, min_sample: float):
    rng = np.random.default_rng(0)
    for layer, shape, past_cache in candidates.PLAN:
        if layer not in selected:
            continue
        x_host = rng.uniform(-1.0, 1.0, size=shape).astype(np.float32)
        x = ops.convert_to_tensor(x_host)
        ours, theirs = candidates._layers(layer, hub)
        ours(x)
        bodies = {"ours": _body(ours)}
        if theirs is not None:
            theirs(x)
            if layer == "learned":
                theirs.position_embeddings.assign(ours.embeddings)
            bodies["keras_hub"] = _body(theirs, add_inputs=layer != "rotary")
        starts = [(0, False), (min(7, candidates.CACHED_POSITIONS - shape[1]), True)]
        starts += [(5000, True)] if past_cache else []
        for start, tensor_start in starts:
            positions = np.arange(start, start + shape[1])
            if layer == "rotary":
                expected, rows = reference.rotary(x_host, positions, MAX_WAVELENGTH), None
            else:
                if layer == "sinusoidal":
                    rows = reference.sinusoidal(positions, shape[-1], MAX_WAVELENGTH)
                else:
                    table = ops.convert_to_numpy(ours.embeddings).astype(np.float64)
                    rows = table[positions]
                expected = x_host.astype(np.float64) + rows
            floors = _floors(layer, shape, positions, rows)
            controls = {name.replace("floor", "control"): body for name, body in floors.items()}
            named = {**floors, **controls, **bodies}
            calls = {name: _compiled(body, x, start, tensor_start) for name, body in named.items()}
            errors = {
                name: float(np.max(np.abs(ops.convert_to_numpy(call().value) - expected)))
                for name, call in calls.items()
            }
            group = {name: timing.Timed(call) for name, call in calls.items()}
            for t in group.values():
                timing.warm_up(t, min_sample)
            past = "†" if start >= 5000 else ""
            label = f"{'tensor' if tensor_start else 'int'} {start}{past}"
            yield (layer, shape, label), group, errors


def _device() -> str:
    """The device the backend computes on, as its library names it."""
    if keras.backend.backend() == "jax":
        import jax

        device = jax.devices()[0]
        return f"{device.platform}: {device.device_kind}"
    import torch

    if torch.cuda.is_available():
        return f"cuda: {torch.cuda.get_device_name()}"
    return "cpu"


def main(args) -> int:
    backend = keras.backend.backend()
    keras.config.set_dtype_policy("float32")
    hub = None
    if not args.without_keras_hub:
        import keras_hub

        hub = keras_hub.layers
    began = time.perf_counter()
    rows = list(_rows(args.layers, hub, args.min_sample_ms / 1e3))
    timing.run_rounds([list(group.values()) for _, group, _ in rows], args.rounds)
    mode = "jax.jit" if backend == "jax" else f"{backend} eager"
    mode += f", {_device()}"
    names = ["floor", "ours", "keras_hub", "control"]
    lines = [
        f"# keras_posenc on Keras's {backend} backend ({mode}), float32, {args.rounds} rounds",
        "",
        f"Command: `python -m benchmarks --backend {backend} --rounds {args.rounds}"
        + (" --without-keras-hub" if args.without_keras_hub else "")
        + "`. Medians in ms; ratios of the medians to the floor (the faster swap, for rotary).",
        "",
        "| layer | shape | start | floor | ours | keras_hub | control | ours/floor "
        "| keras_hub/floor | control/floor | err ours |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for (layer, shape, label), group, errors in rows:
        medians = {name: statistics.median(t.samples) for name, t in group.items()}
        if "floor_flip" in medians:
            # The faster swap is the floor; the control is that same form again.
            floor_flip, control_flip = medians.pop("floor_flip"), medians.pop("control_flip")
            if floor_flip < medians["floor"]:
                medians["floor"], medians["control"] = floor_flip, control_flip
        cells = [f"{medians[n] * 1e3:.3f}" if n in medians else "-" for n in names]
        ratios = [
            f"{medians[n] / medians['floor']:.2f}" if n in medians else "-"
            for n in ("ours", "keras_hub", "control")
        ]
        lines.append(
            f"| {layer} | {'x'.join(map(str, shape))} | {label} | "
            + " | ".join(cells + ratios)
            + f" | {errors['ours']:.1e} |"
        )
    lines += ["", f"{time.perf_counter() - began:.0f} s in all."]
    print("\n".join(lines))
    return 0
