"""What is timed: our layers, their keras_hub peers and the floor, as zero-argument calls.

Every candidate of a case does the same job on the same input:

- `floor`: the least work that gives the answer, with the position rows as constants of
  the table's shape (built on the host in float64, rounded once to float32):
  `x + c` for the additive layers; `x·C + swap(x)·S` for rotary, which is
  `x·cos + rotate_half(x)·sin` with the sign of `rotate_half` folded into `S` and the
  halves swapped the cheapest way we found for each mode and size (the package's
  `swap_pairs`, which picks its form by measurement).
- `ours`: the keras_posenc layer, `layer(x, start_index=s)`.
- `keras_hub`: `x + SinePositionEncoding()(x, start_index=s)`,
  `RotaryEmbedding()(x, start_index=s)`, `x + PositionEmbedding(L)(x, start_index=s)`
  (with the same table as ours).
- `control`: the floor again, as a separate candidate. Identical work, so its ratio to
  the floor is the measurement noise of that row.

A start given as a tensor is an argument of the traced function (a runtime value, as in
decoding with a cache); a Python int start is baked into the trace. The floor ignores the
start: its rows are already the right ones.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator

import numpy as np
import tensorflow as tf

from keras_posenc import LearnedPositionalEmbedding, RotaryEmbedding, SinusoidalPositionalEncoding
from keras_posenc.frequencies import CACHED_POSITIONS, HostConstant
from keras_posenc.rotary import swap_pairs

LAYERS = ("sinusoidal", "rotary", "learned")
MODES = ("eager", "function", "xla")

MAX_WAVELENGTH = 10000.0
LEARNED_MAX_LENGTH = 1024
TINY_SHAPE = (1, 16, 64)
# A small nonzero start keeps a run inside the cached rows but off row 0; the large one
# runs past them, onto the exact computed path (reported, not held to the targets).
SMALL_START = 7
PAST_CACHE_START = 5000


@dataclasses.dataclass(frozen=True)
class Start:
    """The first position of a call: a Python int, or a runtime scalar int32 tensor."""

    value: int
    as_tensor: bool

    @property
    def label(self) -> str:
        return f"tensor {self.value}" if self.as_tensor else f"int {self.value}"


INT_ZERO = Start(0, as_tensor=False)
TENSOR_PAST_CACHE = Start(PAST_CACHE_START, as_tensor=True)


def _starts(shape: tuple[int, ...], past_cache: bool = True) -> tuple[Start, ...]:
    # The runtime start stays inside the cached rows: 7, or less for long sequences.
    small = Start(min(SMALL_START, CACHED_POSITIONS - shape[1]), as_tensor=True)
    return (INT_ZERO, small, TENSOR_PAST_CACHE) if past_cache else (INT_ZERO, small)


# (layer, input shape, starts); the tiny shape measures the cost of one call.
PLAN = tuple(
    (layer, shape, _starts(shape, past_cache))
    for layer, shape, past_cache in (
        ("sinusoidal", (8, 512, 512), True),
        ("sinusoidal", (1, 4096, 1024), True),
        ("sinusoidal", (32, 128, 256), True),
        ("sinusoidal", TINY_SHAPE, False),
        ("rotary", (8, 512, 8, 64), True),
        ("rotary", (1, 4096, 32, 128), True),
        ("rotary", TINY_SHAPE, False),
        ("learned", (8, 512, 512), False),
        ("learned", TINY_SHAPE, False),
    )
)


@dataclasses.dataclass(frozen=True)
class Case:
    """One row of the table: a layer on one input shape, with one kind of start, in one mode."""

    layer: str
    shape: tuple[int, ...]
    start: Start
    mode: str

    @property
    def tiny(self) -> bool:
        return self.shape == TINY_SHAPE

    @property
    def past_cache(self) -> bool:
        """Whether the run leaves the cached rows (our layers then compute them exactly)."""
        return self.layer != "learned" and self.start.value + self.shape[1] > CACHED_POSITIONS


@dataclasses.dataclass
class Prepared:
    """A case's candidates as zero-argument calls, and each one's error against float64."""

    case: Case
    calls: dict[str, Callable[..., tf.Tensor]]
    max_abs_error: dict[str, float]


def cases(layers=LAYERS, modes=MODES) -> list[Case]:
    return [
        Case(layer, shape, start, mode)
        for layer, shape, starts in PLAN
        if layer in layers
        for start in starts
        for mode in modes
    ]


# --- float64 references, written from the formulas (independent of keras_posenc) ---


def _angles(positions: np.ndarray, dim: int) -> np.ndarray:
    omega = MAX_WAVELENGTH ** (-np.arange(0, dim, 2, dtype=np.float64) / dim)
    return np.multiply.outer(positions.astype(np.float64), omega)


def sinusoidal_rows(positions: np.ndarray, width: int) -> np.ndarray:
    """Interleaved encoding: `p[i, 2k] = sin(i·ω_k)`, `p[i, 2k+1] = cos(i·ω_k)`, float64."""
    angles = _angles(positions, width)
    rows = np.empty((len(positions), width))
    rows[:, 0::2] = np.sin(angles)
    rows[:, 1::2] = np.cos(angles)
    return rows


def rotary_tables(positions: np.ndarray, dim: int) -> tuple[np.ndarray, np.ndarray]:
    """Half-split RoPE `(cos, sin)` per channel (channel `k` pairs with `k + dim/2`), float64."""
    angles = _angles(positions, dim)
    return np.tile(np.cos(angles), 2), np.tile(np.sin(angles), 2)


def rotate_half(x: np.ndarray) -> np.ndarray:
    half = x.shape[-1] // 2
    return np.concatenate([-x[..., half:], x[..., :half]], axis=-1)


# --- the floors ---


def _table_shape(rows: np.ndarray, input_rank: int) -> np.ndarray:
    # (sequence, dim) -> (sequence, 1, dim) against (batch, sequence, heads, dim).
    return rows.reshape(rows.shape[:1] + (1,) * (input_rank - 3) + rows.shape[1:])


def _compiled(body, mode: str, x: tf.Tensor, start: Start) -> Callable[..., tf.Tensor]:
    """`body(x, start)` as a call without arguments, eagerly or as a (jit-compiled) tf.function.

    With a tensor start the call also takes another start tensor (to see whether a new
    value compiles again).
    """
    jit_compile = mode == "xla"
    if start.as_tensor:
        start_tensor = tf.constant(start.value, tf.int32)
        if mode == "eager":
            return lambda other=start_tensor: body(x, other)
        function = tf.function(body, jit_compile=jit_compile)
        return lambda other=start_tensor: function(x, other)
    value = start.value
    if mode == "eager":
        return lambda: body(x, value)
    function = tf.function(lambda inputs: body(inputs, value), jit_compile=jit_compile)
    return lambda: function(x)


def floor_and_reference(layer: str, x_host: np.ndarray, start: Start, ours) -> tuple:
    """The floor's `body(x, start)` (the same in every mode) and the float64 reference output.

    `ours` gives the learned layer's table (the same rows for every candidate).
    """
    shape = x_host.shape
    width = shape[-1]
    positions = np.arange(start.value, start.value + shape[1])
    x64 = x_host.astype(np.float64)
    if layer == "rotary":
        cos, sin = rotary_tables(positions, width)
        cos, sin = _table_shape(cos, len(shape)), _table_shape(sin, len(shape))
        reference = x64 * cos + rotate_half(x64) * sin
        sign = np.concatenate([-np.ones(width // 2), np.ones(width // 2)])
        cos_table = HostConstant(cos.astype(np.float32))
        sin_table = HostConstant((sin * sign).astype(np.float32))

        def rotate(x, s):
            return x * cos_table.tensor() + swap_pairs(x, "half") * sin_table.tensor()

        return rotate, reference
    if layer == "sinusoidal":
        rows = sinusoidal_rows(positions, width)
    else:
        rows = ours.embeddings.numpy().astype(np.float64)[positions]
    rows_table = HostConstant(rows.astype(np.float32))

    def add_rows(x, s):
        return x + rows_table.tensor()

    return add_rows, x64 + rows


def _layer_body(layer, add_inputs: bool = False):
    """`body(x, start)` calling `layer`, with `x` added to its output when `add_inputs`.

    The layer is closed over, not a default argument: tf.function would make a default
    argument part of each call's signature and pay for matching it on every call.
    """

    def body(x, start):
        outputs = layer(x, start_index=start)
        return x + outputs if add_inputs else outputs

    return body


def _keras_hub_layers():
    try:
        import keras_hub
    except ImportError as error:
        raise SystemExit(
            "The keras_hub baseline needs keras-hub, a benchmark-only dependency: "
            "pip install -e '.[benchmark]' (or run with --without-keras-hub)."
        ) from error
    return keras_hub.layers


def _layers(layer: str, hub):
    """Our layer and keras_hub's peer (None without keras_hub), unbuilt."""
    if layer == "sinusoidal":
        ours = SinusoidalPositionalEncoding(MAX_WAVELENGTH)
        theirs = hub.SinePositionEncoding(max_wavelength=MAX_WAVELENGTH) if hub else None
    elif layer == "rotary":
        ours = RotaryEmbedding(MAX_WAVELENGTH)
        theirs = hub.RotaryEmbedding(max_wavelength=MAX_WAVELENGTH) if hub else None
    else:
        ours = LearnedPositionalEmbedding(LEARNED_MAX_LENGTH)
        theirs = hub.PositionEmbedding(sequence_length=LEARNED_MAX_LENGTH) if hub else None
    return ours, theirs


def prepare(selected: list[Case], with_keras_hub: bool = True) -> Iterator[Prepared]:
    """Builds every candidate of every case, runs each once and measures its error.

    Layers and inputs are shared by the cases of one (layer, shape); the float64
    reference by the cases of one (layer, shape, start).
    """
    hub = _keras_hub_layers() if with_keras_hub else None
    rng = np.random.default_rng(0)
    groups: dict[tuple, list[Case]] = {}
    for case in selected:
        groups.setdefault((case.layer, case.shape), []).append(case)
    for (layer, shape), group in groups.items():
        x_host = rng.uniform(-1.0, 1.0, size=shape).astype(np.float32)
        x = tf.constant(x_host)
        ours, theirs = _layers(layer, hub)
        ours(x)  # builds
        bodies = {"ours": _layer_body(ours)}
        if theirs is not None:
            theirs(x)
            if layer == "learned":
                theirs.position_embeddings.assign(ours.embeddings)
            # keras_hub's additive layers return the encoding alone.
            bodies["keras_hub"] = _layer_body(theirs, add_inputs=layer != "rotary")

        by_start: dict[Start, list[Case]] = {}
        for case in group:
            by_start.setdefault(case.start, []).append(case)
        for start, start_cases in by_start.items():
            floor, reference = floor_and_reference(layer, x_host, start, ours)
            for case in start_cases:
                calls = {
                    name: _compiled(body, case.mode, x, start)
                    for name, body in {
                        "floor": floor,
                        "control": floor,
                        **bodies,
                    }.items()
                }
                errors = {
                    name: float(np.max(np.abs(call().numpy().astype(np.float64) - reference)))
                    for name, call in calls.items()
                }
                yield Prepared(case, calls, errors)
            del reference
