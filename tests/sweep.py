"""A sweep over layer arguments and call inputs: every outcome is right, a clear error, or NaN.

Each case draws a layer (kind and arguments), an input (shape, dtype, rank) and how the
call names its positions (none, a `start_index` as a Python int or a tensor, explicit
`positions` of any integer type), valid or not, and runs it eagerly, in a `tf.function`
or under XLA. Its outcome is one of

- `right`: the output equals the float64 reference (`tests/reference.py`);
- `error`: a ValueError / TypeError, or a graph assertion of the package, that says what;
- `nan`: an invalid case whose output is NaN (graphs cannot raise under XLA);
- `wrong`: anything else, a finite answer to an invalid case or an output off the
  reference; `unclear`: an error raised by some TensorFlow op, not by the package.

`tests/test_sweep.py` asserts that `wrong` and `unclear` never happen. The counts for the
docs: `python tests/sweep.py --examples 400 --docs docs/reliability.md`.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import os
import sys

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import reference  # noqa: E402
import tensorflow as tf  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import keras_posenc  # noqa: E402

LIMIT = 2**24
MODES = ("eager", "function", "jit")
OUTCOMES = ("right", "error", "nan", "wrong", "unclear")
# Words of the package's own messages: an error that names none of them is not ours.
_OUR_WORDS = ("position", "start_index", "width", "rank", "channels", "dtype", "even", "integer")


@dataclasses.dataclass
class Case:
    kind: str  # sinusoidal | learned | rotary
    arguments: dict
    shape: tuple
    dtype: str
    how: str  # default | start_int | start_tensor | positions | both
    value: object = None
    value_dtype: str = "int32"

    @property
    def category(self) -> str:
        if self.how in ("start_int", "start_tensor"):
            return "start_index"
        if self.how in ("positions", "both"):
            return "positions"
        return "input"


def _limit(case: Case) -> int:
    return case.arguments["max_length"] if case.kind == "learned" else LIMIT


def _positions(case: Case) -> np.ndarray | None:
    """The `(batch, sequence)` positions a valid case names; None when the case is invalid."""
    batch, length, width = case.shape[0], case.shape[1], case.shape[-1]
    if len(case.shape) != 3 or case.dtype != "float32" or case.how == "both":
        return None
    if case.kind != "learned" and width % 2:
        return None
    if case.kind == "rotary" and (case.arguments.get("rotary_dim") or 0) > width:
        return None
    if case.how == "default":
        run = np.arange(length)
    elif case.how in ("start_int", "start_tensor"):
        run = case.value + np.arange(length)
    else:
        run = np.asarray(case.value)
        if run.shape[-1] != length or (run.ndim == 2 and run.shape[0] != batch):
            return None
    if run.min() < 0 or run.max() >= _limit(case):
        return None
    return np.broadcast_to(run, (batch, length))


@st.composite
def cases(draw) -> Case:
    kind = draw(st.sampled_from(["sinusoidal", "learned", "rotary"]))
    width = draw(st.sampled_from([2, 4, 6, 8, 7]))  # 7: odd, refused by sin/cos pairs
    arguments: dict = {}
    if kind == "sinusoidal":
        arguments["layout"] = draw(st.sampled_from(["interleaved", "concat"]))
        arguments["max_wavelength"] = draw(st.sampled_from([10000.0, 500.0]))
    elif kind == "learned":
        arguments["max_length"] = draw(st.integers(1, 40))
    else:
        arguments["layout"] = draw(st.sampled_from(["half", "interleaved"]))
        arguments["rotary_dim"] = draw(st.sampled_from([None, 2, 4, 8]))
    batch = draw(st.integers(1, 3))
    length = draw(st.integers(1, 12))
    shape = draw(st.sampled_from([(batch, length, width)] * 6 + [(batch, length)]))
    dtype = draw(st.sampled_from(["float32"] * 8 + ["int32", "bool"]))
    how = draw(st.sampled_from(["default", "start_int", "start_tensor", "positions", "both"]))
    limit = arguments.get("max_length", LIMIT)
    value, value_dtype = None, "int32"
    edges = [0, 1, limit - length, limit - length + 1, limit, -1, -length, 4090, 2**31 - 1]
    if how in ("start_int", "start_tensor", "both"):
        value = draw(st.one_of(st.sampled_from(edges), st.integers(-5, limit + 5)))
        if how == "start_int":
            value = draw(st.sampled_from([value, value, 2**31 + 3]))
        else:
            value_dtype = draw(st.sampled_from(["int32", "int64"]))
    elif how == "positions":
        value_dtype = draw(st.sampled_from(["int8", "int16", "int32", "int64", "uint8", "uint16"]))
        info = np.iinfo(value_dtype)
        rows = draw(st.sampled_from([None, batch, batch, batch + 1]))
        size = draw(st.sampled_from([length] * 4 + [length + 1]))
        count = size * (rows or 1)
        top = min(int(info.max), limit - 1)
        values = draw(st.lists(st.integers(0, top), min_size=count, max_size=count))
        bad = draw(st.sampled_from([None, None, -1, limit, 2**31 + 7]))
        if bad is not None and info.min <= bad <= info.max:
            values[draw(st.integers(0, count - 1))] = bad
        value = np.array(values).reshape((rows, size) if rows else (size,))
    if how == "both":
        value = int(value) if value is not None else 0
    return Case(kind, arguments, shape, dtype, how, value, value_dtype)


def _layer(case: Case):
    classes = {
        "sinusoidal": keras_posenc.SinusoidalPositionalEncoding,
        "learned": keras_posenc.LearnedPositionalEmbedding,
        "rotary": keras_posenc.RotaryEmbedding,
    }
    return classes[case.kind](**case.arguments)


def _expected(case: Case, layer, x: np.ndarray, positions: np.ndarray) -> np.ndarray:
    if case.kind == "sinusoidal":
        return x + reference.sinusoidal(
            positions, x.shape[-1], case.arguments["max_wavelength"], case.arguments["layout"]
        )
    if case.kind == "learned":
        return x + np.asarray(layer.embeddings, np.float64)[positions]
    return np.stack(
        [
            reference.rotary(
                x[i : i + 1],
                positions[i],
                layout=case.arguments["layout"],
                rotary_dim=case.arguments["rotary_dim"],
            )[0]
            for i in range(x.shape[0])
        ]
    )


def _call(case: Case, layer, x, mode: str):
    if case.how == "default":
        arguments, specs = [], []
    elif case.how == "start_int":
        arguments, specs = [], []
    else:
        value = tf.constant(case.value, case.value_dtype)
        arguments, specs = [value], [tf.TensorSpec([None] * value.shape.rank, value.dtype)]

    def run(inputs, *where):
        if case.how == "start_int":
            return layer(inputs, start_index=case.value)
        if case.how == "start_tensor":
            return layer(inputs, start_index=where[0])
        if case.how == "positions":
            return layer(inputs, positions=where[0])
        if case.how == "both":
            return layer(inputs, positions=tf.range(tf.shape(inputs)[1]), start_index=where[0])
        return layer(inputs)

    inputs = tf.constant(x)
    if mode == "eager":
        return run(inputs, *arguments)
    signature = [tf.TensorSpec([None] * inputs.shape.rank, inputs.dtype), *specs]
    if case.shape[-1:] and len(case.shape) == 3:
        signature[0] = tf.TensorSpec([None, None, case.shape[-1]], inputs.dtype)
    traced = tf.function(run, input_signature=signature, jit_compile=(mode == "jit"))
    return traced(inputs, *arguments)


def outcome(case: Case, mode: str) -> str:
    """What the case gives in `mode`: one of `OUTCOMES`."""
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, case.shape).astype(case.dtype)
    positions = _positions(case)
    try:
        layer = _layer(case)
        output = np.asarray(_call(case, layer, x, mode), np.float64)
    except (ValueError, TypeError) as error:
        return "error" if str(error) else "unclear"
    except tf.errors.InvalidArgumentError as error:
        message = error.message.lower()
        return "error" if any(word in message for word in _OUR_WORDS) else "unclear"
    if positions is None:
        # Every row poisoned (a partial rotation passes its other channels through).
        poisoned = output.shape == case.shape and np.isnan(output).any(axis=-1).all()
        return "nan" if poisoned else "wrong"
    if output.shape != case.shape or not np.isfinite(output).all():
        return "wrong"
    expected = _expected(case, layer, x.astype(np.float64), positions)
    return "right" if np.abs(output - expected).max() <= 1e-6 else "wrong"


def sweep(examples: int, modes=MODES) -> dict:
    """Counts of outcomes per category and mode over `examples` drawn cases (each in every mode)."""
    counts: dict = collections.defaultdict(collections.Counter)
    failures = []

    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
    )
    @given(case=cases())
    def run(case):
        for mode in modes:
            result = outcome(case, mode)
            counts[(case.category, mode)][result] += 1
            if result in ("wrong", "unclear"):
                failures.append((mode, case))

    run()
    return {"counts": counts, "failures": failures}


def markdown(result: dict, command: str) -> str:
    lines = [
        "# Reliability: what the layers do with any input",
        "",
        "Each case is a layer with drawn arguments called on a drawn input and drawn "
        "positions (valid or not), in each mode. `wrong` counts finite answers to invalid "
        "cases and outputs off the float64 reference; `unclear` errors not raised by the "
        "package. Both must be 0 (`tests/test_sweep.py` asserts it on a smaller sweep).",
        "",
        f"Command: `{command}`",
        "",
        "| category | mode | tried | right | clear error | NaN | wrong | unclear |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for (category, mode), counter in sorted(result["counts"].items()):
        tried = sum(counter.values())
        cells = [counter[o] for o in OUTCOMES]
        lines.append(f"| {category} | {mode} | {tried} | " + " | ".join(map(str, cells)) + " |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=400)
    parser.add_argument("--docs", default=None, help="write the Markdown table here")
    arguments = parser.parse_args(argv)
    result = sweep(arguments.examples)
    text = markdown(result, f"python tests/sweep.py --examples {arguments.examples}")
    print(text)
    for mode, case in result["failures"][:10]:
        print("FAILED", mode, case)
    if arguments.docs:
        with open(arguments.docs, "w") as file:
            file.write(text)
    return 1 if result["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
