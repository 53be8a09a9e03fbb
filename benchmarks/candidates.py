"""Each layer on each input shape and start, eagerly, in `tf.function` and in
`tf.function(jit_compile=True)` (`xla`), float32, as four candidates doing the same job on
the same input (`benchmarks/candidates.py`):

- `floor`: the least work that gives the answer, the rows for the call's positions as
  float32 constants (float64 from `tests/reference.py`, rounded once): `x + c`; for rotary
  `x·C + swap(x)·S` (half layout, the sign of rotate-half folded into `S`), its swap written
  in the benchmark in five forms (last table); per shape and mode the fastest of them in a
  short interleaved trial is the floor, so a swap the package chose badly shows against it.
- `ours`: `SinusoidalPositionalEncoding()`, `RotaryEmbedding()`,
  `LearnedPositionalEmbedding(1024)`, called as `layer(x, start_index=s)`.
- `keras_hub`: `x + SinePositionEncoding()(x, start_index=s)`,
  `RotaryEmbedding()(x, start_index=s)`, `x + PositionEmbedding(1024)(x, start_index=s)`
  (holding our learned table).
- `control`: the floor again, as its own candidate: identical work, so `control/floor` is
  the noise of that row.

Starts: the Python int 0 (baked into the trace); a runtime scalar int32 tensor (7, or 0 for
4096-long sequences), an argument of the traced function as in decoding with a cache; and a
tensor 5000 (†), past the 4096 cached rows, where our layers compute the rows exactly:
reported, not held to the floor. `err` is the max |output − float64 reference| of each
candidate. After the rounds every tensor-start case in tf.function and XLA is called with a
new start twice, to see whether a new value compiles again.

The additive floor is a broadcasting add, as in our layers. keras_hub's layers broadcast
the rows first (`broadcast_to`, which the graph optimizer folds into a batch-sized constant
when shapes are static), which is where keras_hub can be ahead in tf.function with a Python
start. Broadcasting first is no general win: `benchmarks/broadcast_add.py` (in git at
f084267), rerun 2026-12-01 on the shared 2-core machine over five sizes from (1, 16, 64) to
(16, 512, 512), put it at 0.83-1.46x the broadcasting add in tf.function and 1.09-1.51x
eagerly; folded, it is a batch-sized constant in every static-shape graph and ONNX file.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Callable, Iterator

import numpy as np

from benchmarks import reference, timing
from benchmarks.choices import LAYERS, MODES  # noqa: F401  (light: --help loads only it)
from keras_posenc import LearnedPositionalEmbedding, RotaryEmbedding, SinusoidalPositionalEncoding
from keras_posenc.backend.lazy import tf  # TensorFlow's modes only: --backend jax / torch need none
from keras_posenc.frequencies import CACHED_POSITIONS

MAX_WAVELENGTH = 10000.0
TINY_SHAPE = (1, 16, 64)
# float32 arithmetic on values of size about 1 rounds by a few 1e-8: 1e-6 catches any
# real loss of precision, in a candidate and in a floor form alike.
PRECISION_BOUND = 1e-6
FORM_TRIAL_ROUNDS = 9
# (layer, input shape, whether to run past the cached rows); the tiny shape measures the
# cost of one call (rotary: 16 positions of 64 channels, rank 3).
PLAN = (
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


@dataclasses.dataclass(frozen=True)
class Case:
    """One row of the table: a layer on one input shape, from one start, in one mode."""

    layer: str
    shape: tuple[int, ...]
    start: int
    tensor_start: bool  # a runtime scalar tensor, or a Python int baked into the trace
    mode: str

    @property
    def start_label(self) -> str:
        return f"{'tensor' if self.tensor_start else 'int'} {self.start}"

    @property
    def past_cache(self) -> bool:
        """Whether the run leaves the cached rows (our layers then compute them exactly)."""
        return self.layer != "learned" and self.start + self.shape[1] > CACHED_POSITIONS


@dataclasses.dataclass
class Prepared:
    """A case's candidates as calls without arguments, and each one's error against float64."""

    case: Case
    calls: dict[str, Callable[..., tf.Tensor]]
    max_abs_error: dict[str, float]
    floor_form: str | None = None  # the rotary floor's swap form
    form_medians: dict[str, float] | None = None  # seconds of every form in its trial


def cases(layers=LAYERS, modes=MODES) -> list[Case]:
    selected = []
    for layer, shape, past_cache in PLAN:
        starts = [(0, False), (min(7, CACHED_POSITIONS - shape[1]), True)]
        starts += [(5000, True)] if past_cache else []
        if layer in layers:
            selected += [Case(layer, shape, *start, mode) for start in starts for mode in modes]
    return selected


def _constant(array: np.ndarray) -> Callable[[], tf.Tensor]:
    """`array` in float32: a graph constant when traced (foldable), one cached tensor eagerly."""
    array = array.astype(np.float32)
    eager = tf.constant(array)
    return lambda: eager if tf.executing_eagerly() else tf.constant(array)


def rotary_forms(shape: tuple[int, ...], positions: np.ndarray) -> dict[str, Callable]:
    """`x·C + swap(x)·S` (half layout, last axis) per swap form: `{form: body(x, start)}`.

    `C = [cos, cos]`, `S = [-sin, sin]`; `"halves"` is the same sum per half, on half tables.
    """
    width, half = shape[-1], shape[-1] // 2
    theta = reference.angles(positions, width, MAX_WAVELENGTH)
    theta = theta.reshape(theta.shape[:1] + (1,) * (len(shape) - 3) + theta.shape[1:])
    cos, sin = np.cos(theta), np.sin(theta)
    c, s = _constant(cos), _constant(sin)
    big_c, big_s = _constant(np.tile(cos, 2)), _constant(np.concatenate([-sin, sin], -1))
    paired, permutation = [*shape[:-1], 2, half], np.r_[half:width, 0:half].astype(np.int32)

    def swapped(swap):
        return lambda x, start: x * big_c() + swap(x) * big_s()

    def halves(x, start):
        first, second = tf.split(x, 2, axis=-1)
        return tf.concat([first * c() - second * s(), second * c() + first * s()], -1)

    return {
        "roll": swapped(lambda x: tf.roll(x, half, axis=-1)),
        "concat": swapped(lambda x: tf.concat([x[..., half:], x[..., :half]], -1)),
        "reverse": swapped(lambda x: tf.reshape(tf.reverse(tf.reshape(x, paired), [-2]), shape)),
        "gather": swapped(lambda x: tf.gather(x, permutation, axis=-1)),
        "halves": halves,
    }


def compiled(body: Callable, case: Case, x: tf.Tensor) -> Callable[..., tf.Tensor]:
    """`body(x, start)` as a call without arguments, eagerly or as a (jit-compiled) tf.function.

    `x` is an argument, never a captured constant XLA could fold. With a tensor start the
    call takes another start tensor too (to see whether a new value compiles again).
    """
    wrap = (lambda f: f) if case.mode == "eager" else tf.function(jit_compile=case.mode == "xla")
    if case.tensor_start:
        function, start = wrap(body), tf.constant(case.start, tf.int32)
        return lambda other=start: function(x, other)
    function = wrap(lambda inputs: body(inputs, case.start))
    return lambda: function(x)


def _error(call: Callable[..., tf.Tensor], expected: np.ndarray) -> float:
    return float(np.max(np.abs(call().numpy().astype(np.float64) - expected)))


def fastest_form(x: tf.Tensor, mode: str, min_sample: float) -> tuple[str, dict[str, float]]:
    """The rotary floor's form for `x` in `mode`: the least median in interleaved rounds
    among the forms within `PRECISION_BOUND`; and every such form's median (s)."""
    positions = np.arange(x.shape[1])
    expected = reference.rotary(x.numpy(), positions, MAX_WAVELENGTH)
    case = Case("rotary", tuple(x.shape), 0, False, mode)
    trial = {}
    for name, body in rotary_forms(case.shape, positions).items():
        call = compiled(body, case, x)
        if _error(call, expected) <= PRECISION_BOUND:
            trial[name] = timing.Timed(call)
            timing.warm_up(trial[name], min_sample)
    timing.run_rounds([list(trial.values())], FORM_TRIAL_ROUNDS, progress=False)
    medians = {name: statistics.median(t.samples) for name, t in trial.items()}
    return min(medians, key=medians.get), medians


def _layers(layer: str, hub) -> tuple:
    """Our layer and keras_hub's peer (None without keras_hub), unbuilt."""
    if layer == "sinusoidal":
        return SinusoidalPositionalEncoding(), hub and hub.SinePositionEncoding()
    if layer == "rotary":
        return RotaryEmbedding(), hub and hub.RotaryEmbedding()
    return LearnedPositionalEmbedding(1024), hub and hub.PositionEmbedding(sequence_length=1024)


def _layer_body(layer, add_inputs: bool = False) -> Callable:
    # The layer is closed over, not a default argument: tf.function would make a default
    # argument part of each call's signature and pay for matching it on every call.
    def body(x, start):
        outputs = layer(x, start_index=start)
        return x + outputs if add_inputs else outputs

    return body


def prepare(selected: list[Case], min_sample: float, hub=None) -> Iterator[Prepared]:
    """Builds every candidate of every case, runs each once and measures its error.

    Layers and inputs are shared by the cases of one (layer, shape); `hub` is
    `keras_hub.layers` or None. The rotary floor's form is chosen once per (shape, mode).
    """
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
        if theirs:
            theirs(x)
            if layer == "learned":
                theirs.position_embeddings.assign(ours.embeddings)
            # keras_hub's additive layers return the encoding alone.
            bodies["keras_hub"] = _layer_body(theirs, add_inputs=layer != "rotary")
        forms = {}
        if layer == "rotary":
            forms = {
                m: fastest_form(x, m, min_sample) for m in dict.fromkeys(c.mode for c in group)
            }
        for start in dict.fromkeys(case.start for case in group):
            positions = np.arange(start, start + shape[1])
            if layer == "rotary":
                expected = reference.rotary(x_host, positions, MAX_WAVELENGTH)
                floors = rotary_forms(shape, positions)
            else:
                if layer == "sinusoidal":
                    rows = reference.sinusoidal(positions, shape[-1], MAX_WAVELENGTH)
                else:
                    rows = ours.embeddings.numpy().astype(np.float64)[positions]
                row_constant = _constant(rows)
                floors = {None: lambda x, start, rows=row_constant: x + rows()}
                expected = x_host.astype(np.float64) + rows
            for case in (case for case in group if case.start == start):
                form, medians = forms.get(case.mode, (None, None))
                named = {"floor": floors[form], "control": floors[form], **bodies}
                calls = {name: compiled(body, case, x) for name, body in named.items()}
                errors = {name: _error(call, expected) for name, call in calls.items()}
                yield Prepared(case, calls, errors, form, medians)
            del expected
