"""What a verification runs: the shapes a model accepts and positions that reach every table.

A model's position layers read rows from tables: the first `CACHED_POSITIONS` rows of a
sinusoidal or rotary table are held whole, positions past them come from two split tables
(fine rows `i % CACHED_POSITIONS`, coarse rows `i // CACHED_POSITIONS`), and a learned
table has `max_length` rows. A verification that only runs short sequences from position 0
would pass a file whose later rows are wrong, so the cases here reach each table near its
start and near its end:

- a model with a scalar `start_index` input runs each sequence from several starts: 0, the
  last run inside the cached rows, a run across their end, a run across the end of the
  fine table, a run across the last two coarse rows, and the last run below the largest
  allowed position (those that fit below it);
- a model with an integer `positions` input gets positions drawn from the same places
  (the first rows, both sides of each table boundary, the last rows), spread over its
  batch rows and steps, the rest random; positions with a trailing axis of coordinates
  (`(batch, sequence, axes)`, or `(sequence, axes)` for a multi-axis layer) get every
  probe on every axis, each axis in its own order, so that a token's coordinates differ;
- a model with neither reaches rows `0 .. length - 1` only: its longest case is the longest
  sequence it allows, or, with no limit known, `REACHING_LENGTHS`: `CACHED_POSITIONS` steps
  (every cached row) and 17 more (a run that long is computed from the split tables).
"""

from __future__ import annotations

from collections.abc import Sequence

import keras
import numpy as np
import tensorflow as tf

from keras_posenc.backend import tensorflow as tf_backend
from keras_posenc.export.signature import export_bound, input_signature
from keras_posenc.frequencies import CACHED_POSITIONS, MAX_POSITIONS

BATCH_SIZES = (1, 2, 3, 8)
SEQUENCE_LENGTHS = (1, 2, 17, 128, 511)
# An unbounded model with no position input: a run of CACHED_POSITIONS steps reads every
# cached row; a longer one is computed from the split tables instead (a few of their rows).
REACHING_LENGTHS = (CACHED_POSITIONS, CACHED_POSITIONS + 17)
_POSITION_KEYWORDS = ("positions", "query_positions", "key_positions")


def checked_sizes(values, name: str) -> tuple[int, ...]:
    """`values` as a non-empty tuple of positive ints, or a ValueError that says what is wrong."""
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
        raise ValueError(f"{name} must be a sequence of positive integers, got {values!r}.")
    values = tuple(values)
    if not values:
        raise ValueError(f"{name} is empty: give at least one positive integer.")
    for value in values:
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
            raise ValueError(f"{name} must hold integers, got {value!r} in {values}.")
        if value < 1:
            raise ValueError(
                f"{name} must hold positive integers, got {value} in {values}: a case with "
                "nothing in it compares nothing."
            )
    return tuple(int(v) for v in values)


def longest_sequence(model: keras.Model) -> int | None:
    """The longest sequence the model allows, when its layers say: the smallest learned
    table, or the slots of a key/value cache the model writes."""
    from keras_posenc.layers.learned import LearnedPositionalEmbedding

    lengths = [
        layer.max_length
        for layer in tf_backend.all_layers(model)
        if isinstance(layer, LearnedPositionalEmbedding)
    ]
    lengths += cache_lengths(model).values()
    return min(lengths) if lengths else None


def cache_lengths(model: keras.Model) -> dict[str, int]:
    """`{input name: cache max_length}` of the inputs the model passes as a layer's
    `cache_update_index` (a decode step): a slot, not a position to probe with."""
    names = {
        id(tensor): spec.name
        for spec, tensor in zip(input_signature(model), model.inputs, strict=True)
    }
    lengths = {}
    for layer in tf_backend.all_layers(model):
        for arguments in tf_backend.call_keyword_arguments(layer):
            name = names.get(id(arguments.get("cache_update_index")))
            cache = arguments.get("cache")
            if name is not None and cache is not None and cache.shape[2] is not None:
                lengths[name] = min(lengths.get(name, cache.shape[2]), int(cache.shape[2]))
    return lengths


def position_limit(model: keras.Model, max_sequence_length: int | None = None) -> int:
    """Positions the model accepts are below this: `max_sequence_length` (the bound its
    files were exported for), else its smallest learned table, else MAX_POSITIONS."""
    return export_bound(model, max_sequence_length) or MAX_POSITIONS


def position_inputs(model: keras.Model) -> dict[str, str]:
    """The model's integer inputs that carry positions:
    `{name: "start_index" | "positions" | "cache_update_index"}`.

    An input passed as a layer's `cache_update_index` is the cache slot of a decode step;
    another scalar integer input is a start index. An integer input of rank 1 to 3 carries
    positions when the model passes it as `positions=` (or `query_positions=`,
    `key_positions=`) to a layer, or when its name says `position`; others are token ids.
    """
    kinds = dict.fromkeys(cache_lengths(model), "cache_update_index")
    by_id = {}
    for spec, tensor in zip(input_signature(model), model.inputs, strict=True):
        if not spec.dtype.is_integer:
            continue
        if spec.shape.rank == 0:
            kinds.setdefault(spec.name, "start_index")
        elif "position" in spec.name.lower():
            kinds[spec.name] = "positions"
        by_id[id(tensor)] = spec.name
    for layer in getattr(model, "layers", []):
        for arguments in tf_backend.call_keyword_arguments(layer):
            for keyword, value in arguments.items():
                name = by_id.get(id(value))
                if name is not None and keyword in _POSITION_KEYWORDS:
                    kinds.setdefault(name, "positions")
    return kinds


def position_axes(model: keras.Model) -> dict[str, int]:
    """The coordinates per position of each positions input: `{name: axes}` (1 for 1D).

    An input of rank 3 is `(batch, sequence, axes)`. An input of rank 2 is
    `(batch, sequence)`, unless it is passed to a layer of several axes
    (`SinusoidalPositionalEncoding(axes=n)`, `RotaryEmbedding(axes_dims=...)` or
    `mrope_section=...`): then it is `(sequence, axes)`, one grid for every batch row.
    """
    specs = {spec.name: spec for spec in input_signature(model)}
    multi_axis = _multi_axis_inputs(model)
    axes = {}
    for name, kind in position_inputs(model).items():
        if kind != "positions":
            continue
        shape = specs[name].shape
        if shape.rank == 3 or (shape.rank == 2 and name in multi_axis):
            axes[name] = int(shape[-1])
        else:
            axes[name] = 1
    return axes


def _multi_axis_inputs(model: keras.Model) -> set[str]:
    """Names of the model inputs passed as `positions=` to a layer of several axes."""
    by_id = {
        id(tensor): spec.name
        for spec, tensor in zip(input_signature(model), model.inputs, strict=True)
    }
    names = set()
    for layer in tf_backend.all_layers(model):
        axes = getattr(layer, "axes", 1)
        for option in ("axes_dims", "mrope_section"):
            if getattr(layer, option, None) is not None:
                axes = len(getattr(layer, option))
        if not isinstance(axes, int) or axes < 2:
            continue
        for arguments in tf_backend.call_keyword_arguments(layer):
            value = arguments.get("positions")
            if id(value) in by_id:
                names.add(by_id[id(value)])
    return names


def _positions_per_case(model: keras.Model, batch: int, sequence: int) -> int:
    """How many probes one case's positions hold (the fewest over the positions inputs)."""
    specs = {spec.name: spec for spec in input_signature(model)}
    counts = [
        sequence if axes > 1 and specs[name].shape.rank == 2 else batch * sequence
        for name, axes in position_axes(model).items()
    ]
    return min(counts, default=batch * sequence)


def probe_positions(limit: int) -> np.ndarray:
    """The positions every table boundary is tested at, below `limit`, sorted."""
    points = {0, 1, 2, limit - 3, limit - 2, limit - 1}
    for boundary in (CACHED_POSITIONS, 2 * CACHED_POSITIONS, limit - CACHED_POSITIONS):
        points.update(range(boundary - 3, boundary + 3))
    return np.array(sorted(p for p in points if 0 <= p < limit), np.int64)


def start_indices(sequence: int, limit: int) -> list[int]:
    """The starts a run of `sequence` steps is verified from (see the module docstring)."""
    half = sequence // 2
    starts = [
        0,
        CACHED_POSITIONS - sequence,
        CACHED_POSITIONS - half,
        2 * CACHED_POSITIONS - half,
        limit - CACHED_POSITIONS - half,
        limit - sequence,
    ]
    return sorted({s for s in starts if 0 <= s <= limit - sequence})


def _fixed_axis(specs: list, axis: int) -> int | None:
    sizes = [spec.shape[axis] for spec in specs if spec.shape.rank > axis]
    if any(size is None for size in sizes) or not sizes:
        return None
    return sizes[0]


def verification_cases(
    model: keras.Model,
    batch_sizes: Sequence[int] = BATCH_SIZES,
    sequence_lengths: Sequence[int] = SEQUENCE_LENGTHS,
    longest: int | None = None,
) -> list[dict]:
    """The cases `verify_export` runs: `{"batch", "sequence"[, "start_index"]}` dicts.

    (With a positions input, each case also says from which probe its positions start,
    `probe_offset`: see `default_inputs`.)

    Batch sizes and sequence lengths are those the model accepts: a batch or sequence
    axis the model's inputs fix is verified at that size only; otherwise every batch
    size with every length up to `longest` (default: the model's own limit), and that
    longest (for an unbounded model with no position input: `REACHING_LENGTHS`, at the
    smallest batch size only). A model
    with a `start_index` input runs each shape from every start of `start_indices`; starts
    and positions stay below `position_limit(model, longest)`.
    """
    batch_sizes = checked_sizes(batch_sizes, "batch_sizes")
    sequence_lengths = checked_sizes(sequence_lengths, "sequence_lengths")
    specs = [spec for spec in input_signature(model) if spec.shape.rank > 0]
    kinds = position_inputs(model)
    table = longest_sequence(model)
    if longest is not None and table is not None and longest > table:
        raise ValueError(
            f"max_sequence_length {longest} is longer than the model allows: its learned "
            f"position table has {table} rows. Verify up to {table}."
        )
    limit = position_limit(model, longest)
    longest = longest or table
    fixed_batch = _fixed_axis(specs, 0)
    batches = [fixed_batch] if fixed_batch else list(dict.fromkeys(batch_sizes))
    reaching = False
    if not any(spec.shape.rank > 1 and spec.shape[1] is None for spec in specs):
        # Every axis 1 is fixed: the case's "sequence" is the longest of them.
        lengths = [max((s.shape[1] for s in specs if s.shape.rank > 1), default=1)]
    else:
        reaching = longest is None and not kinds
        lengths = sorted(
            {n for n in sequence_lengths if longest is None or n <= longest}
            | ({longest} if longest else set())
        )
    cases = []
    for batch in batches:
        # The long case that reaches every cached row runs once, at the smallest batch.
        extra = list(REACHING_LENGTHS) if reaching and batch == min(batches) else []
        for sequence in lengths + extra:
            if "start_index" in kinds.values():
                cases.extend(
                    {"batch": batch, "sequence": sequence, "start_index": start}
                    for start in start_indices(sequence, limit)
                )
            else:
                cases.append({"batch": batch, "sequence": sequence})
    if "positions" in kinds.values():
        # Each case takes the next probes where the previous one stopped; cases are
        # added (the smallest batch, the longest length) until every probe is taken.
        probes = len(probe_positions(limit))
        offset = 0
        for case in cases:
            case["probe_offset"] = offset % probes
            offset += _positions_per_case(model, case["batch"], case["sequence"])
        while offset < probes:
            case = {"batch": min(batches), "sequence": max(lengths), "probe_offset": offset}
            cases.append(case)
            offset += _positions_per_case(model, case["batch"], case["sequence"])
    return cases


def verification_shapes(
    longest: int | None,
    batch_sizes: Sequence[int] = BATCH_SIZES,
    sequence_lengths: Sequence[int] = SEQUENCE_LENGTHS,
) -> list[tuple[int, int]]:
    """`(batch, sequence)` pairs: every batch size with every length up to `longest`, and it."""
    batch_sizes = checked_sizes(batch_sizes, "batch_sizes")
    sequence_lengths = checked_sizes(sequence_lengths, "sequence_lengths")
    lengths = sorted(
        {n for n in sequence_lengths if longest is None or n <= longest}
        | ({longest} if longest else set())
    )
    return [(batch, length) for batch in batch_sizes for length in lengths]


def default_inputs(
    model: keras.Model,
    batch: int,
    sequence: int,
    longest: int | None = None,
    seed: int = 0,
    *,
    start_index: int | None = None,
    probe_offset: int = 0,
) -> dict[str, np.ndarray]:
    """Inputs for `model`, by input name, for one verification case.

    Float inputs are standard normal; a start index is `start_index` (default: 0);
    positions inputs hold `probe_positions` from `probe_offset` on, spread over the batch
    rows and steps (as many as fit), the rest random below the model's limit
    (`position_limit(model, longest)`); with a trailing axis of coordinates every axis
    holds them, axis `a` from `a` probes later (`(sequence, axes)` positions, see
    `position_axes`, are one grid for all rows); other integer inputs are token ids below
    the smallest `Embedding` vocabulary in the model (0 or 1 without one). Axes the model
    fixes keep their sizes.
    """
    rng = np.random.default_rng([seed, batch, sequence, start_index or 0])
    vocabularies = [
        layer.input_dim
        for layer in tf_backend.all_layers(model)
        if isinstance(layer, keras.layers.Embedding)
    ]
    high = min(vocabularies) if vocabularies else 2
    kinds = position_inputs(model)
    longest_slots = cache_lengths(model)
    axes = position_axes(model)
    limit = position_limit(model, longest)
    feeds = {}
    for spec in input_signature(model):
        wanted = [batch, sequence, *spec.shape[2:]]
        if axes.get(spec.name, 1) > 1 and spec.shape.rank == 2:
            wanted = [sequence, spec.shape[1]]  # (sequence, axes): one grid for every row
        shape = [
            given if given is not None else size
            for given, size in zip(spec.shape, wanted, strict=False)
        ]
        dtype = spec.dtype.as_numpy_dtype
        kind = kinds.get(spec.name)
        if spec.dtype.is_floating:
            value = rng.standard_normal(shape)
        elif spec.dtype == tf.bool:
            value = rng.integers(0, 2, shape)
        elif kind == "cache_update_index":  # a slot where the case's tokens fit the cache
            value = np.array(rng.integers(0, max(longest_slots[spec.name] - sequence, 0) + 1))
        elif kind == "start_index" or spec.shape.rank == 0:
            value = np.array(start_index or 0)
        elif kind == "positions":
            value = _probing_positions(rng, shape, axes[spec.name], limit, probe_offset)
        else:
            value = rng.integers(0, high, shape)
        feeds[spec.name] = np.asarray(value).astype(dtype)
    return feeds


def _probing_positions(rng, shape, axes: int, limit: int, probe_offset: int) -> np.ndarray:
    """Random positions below `limit` of `shape`, the probes from `probe_offset` on first.

    With `axes > 1` the last axis holds coordinates: each axis gets the probes, axis `a`
    from `probe_offset + a` on, so every axis reaches every table boundary (cases that
    follow each other take the probes in turn) and no token has equal coordinates only.
    """
    value = rng.integers(0, limit, shape).reshape(-1, axes)
    probes = probe_positions(limit)
    count = min(len(probes), value.shape[0])
    for axis in range(axes):
        value[:count, axis] = np.roll(probes, -(probe_offset + axis))[:count]
    return value.reshape(shape)


def covered_coordinates(model: keras.Model, feeds: dict) -> dict[str, list[np.ndarray]]:
    """Per multi-axis positions input, the coordinates a case's inputs hold on each axis."""
    return {
        name: [np.unique(np.asarray(feeds[name])[..., a].astype(np.int64)) for a in range(axes)]
        for name, axes in position_axes(model).items()
        if axes > 1
    }


def covered_positions(model: keras.Model, feeds: dict, sequence: int) -> np.ndarray:
    """The positions a case's inputs make the model's position layers read, sorted, unique."""
    kinds = position_inputs(model)
    positions = []
    for name, kind in kinds.items():
        value = np.asarray(feeds[name]).astype(np.int64)
        if kind == "start_index":
            positions.append(int(value) + np.arange(sequence))
        else:
            positions.append(value.reshape(-1))
    if not positions:
        positions.append(np.arange(sequence))
    return np.unique(np.concatenate(positions))


def as_ranges(positions: np.ndarray) -> list[list[int]]:
    """Sorted unique positions as `[first, last]` runs of consecutive positions."""
    positions = np.unique(np.asarray(positions, np.int64))
    if positions.size == 0:
        return []
    breaks = np.flatnonzero(np.diff(positions) != 1)
    firsts = np.concatenate([[0], breaks + 1])
    lasts = np.concatenate([breaks, [positions.size - 1]])
    return [[int(positions[a]), int(positions[b])] for a, b in zip(firsts, lasts, strict=True)]
