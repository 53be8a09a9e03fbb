"""What a RoPE `scaling` dict means for a rotation, and the rows of the types that switch.

A `scaling` dict has the shape of the transformers library's `rope_scaling` /
`rope_parameters` (`modeling_rope_utils.py`): a `rope_type` and that type's keys.
`rope_parameters` checks it and runs its type's function (`keras_posenc.rope.registry`):
the inverse frequencies and the attention factor, which multiplies cos and sin.

A type whose frequencies change with the total length gets its rows from `SwitchByLength`
(longrope: two tables) or `DynamicRows` (dynamic NTK: frequencies made for the length).
"""

from __future__ import annotations

import numpy as np
from keras import ops

from keras_posenc._lazy import tricks
from keras_posenc.frequencies import as_rows, inverse_frequencies
from keras_posenc.rope.keys import check_shared_keys, checked_scaling
from keras_posenc.rope.registry import ROPE_TYPES
from keras_posenc.rope.rope_type import RopeParameters


def rope_parameters(rotary_dim: int, max_wavelength: float, scaling: dict | None) -> RopeParameters:
    """The inverse frequencies and attention factor that `scaling` defines."""
    omega = inverse_frequencies(rotary_dim, max_wavelength)
    scaling = checked_scaling(scaling)  # refuses a type the registry does not hold
    if scaling is not None:
        check_shared_keys(scaling, max_wavelength)
    rope_type = "default" if scaling is None else scaling["rope_type"]
    return ROPE_TYPES[rope_type].compute(omega, rotary_dim, max_wavelength, scaling)


class SwitchByLength:
    """Rows of `short` while the total length is at most `switch_length`, of `long` past it.

    The total length is `start_index + sequence` for a run and the largest position + 1
    for explicit positions; it is decided at trace time when known, else at run time
    (`keras.ops.cond`).
    """

    def __init__(self, short, long, switch_length: int):
        self.short = short
        self.long = long
        self.switch_length = switch_length

    def slice(self, start, length, combine=as_rows, traced=None):
        return self._choose(
            start + length,
            lambda table, combine: table.slice(start, length, combine, traced),
            combine,
        )

    def gather(self, positions) -> tuple:
        return self._choose(
            ops.max(positions) + 1,
            lambda table, combine: combine(*table.gather(positions)),
            as_rows,
        )

    def _choose(self, total_length, rows, combine):
        """`combine` of `rows(table, combine_inside)` of the table `total_length` picks: where
        `combine` runs is the backend's (`tricks().combined`)."""
        t = tricks()
        known = t.static_value(total_length)
        if known is not None:
            table = self.long if known > self.switch_length else self.short
            return t.combined(lambda inside: rows(table, inside), combine)
        return t.combined(
            lambda inside: t.cond(
                total_length > self.switch_length,
                lambda: rows(self.long, inside),
                lambda: rows(self.short, inside),
            ),
            combine,
        )


class DynamicRows:
    """Rows for dynamic NTK scaling: frequencies for the total length as two float32 words
    (`keras_posenc.dynamic_ntk`), rotated by the fixed-point `tricks().exact_sin_cos`."""

    def __init__(self, omega: np.ndarray, factor: float, max_position_embeddings: int, layout):
        from keras_posenc.dynamic_ntk import DynamicFrequencies

        self.frequencies = DynamicFrequencies(omega, factor, max_position_embeddings)
        self.layout = layout

    def slice(self, start, length, combine=as_rows, traced=None):
        positions = ops.arange(length, dtype="int32") + start
        total_length = tricks().total_length_of_run(start, length, positions)
        return combine(*self._rows(positions, total_length))

    def gather(self, positions) -> tuple:
        return self._rows(positions, ops.max(positions) + 1)

    def _rows(self, positions, total_length) -> tuple:
        turns = self.frequencies.turns(total_length)
        return tuple(self.layout(*tricks().exact_sin_cos(positions, turns)))
