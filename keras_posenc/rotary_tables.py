"""RoPE's rows: the tables `(C, S)` per channel, the channel swap, the frequencies of a scaling.

`RotaryEmbedding` computes `y = x·C + swap(x)·S` (`keras_posenc.rotary`); this module makes
what it multiplies with. `C = cos` and `S = ∓sin` (minus on a pair's first channel) per
channel come ready from the shared frequency table; a scaling that switches frequencies
by the total length (`longrope`, `dynamic`) gets a `SwitchByLength` between two sources
of rows (`keras_posenc.rope` defines the frequencies themselves).
"""

from __future__ import annotations

import numpy as np

from keras_posenc import layouts
from keras_posenc._lazy import tricks
from keras_posenc.frequencies import FrequencyTable, PositionTable, position_table
from keras_posenc.rope import DynamicRows, SwitchByLength, rope_parameters


def channel_tables(layout: str, sin, cos) -> tuple:
    """`(C, S)` per channel from `(sin, cos)` per pair, both `(..., rotary_dim)`, in the
    backend's ops (`keras_posenc.layouts.channel_tables` for the host tables)."""
    return tricks().channel_tables(layout, sin, cos)


def swap_pairs(x, layout: str, axis: int = -1, form: str | None = None):
    """Exchange the two channels of every rotation pair along `axis` of `x`.

    `form` is how (see `tricks().swap_form`, the one place it is chosen); by default the
    form chosen for `x` in the graph being traced.
    """
    t = tricks()
    return t.swap_pairs(x, layout, axis, form or t.swap_form(x))


def rotation_table(
    rotary_dim: int, layout: str, omega: np.ndarray, attention_factor: float = 1.0
) -> PositionTable:
    """The shared `PositionTable` whose rows are RoPE's `(C, S)` for frequencies `omega`."""
    return position_table(
        ("rotary", rotary_dim, layout, float(attention_factor), omega.tobytes()),
        lambda: PositionTable(
            FrequencyTable(omega, scale=attention_factor),
            lambda sin, cos: channel_tables(layout, sin, cos),
            lambda sin, cos: layouts.channel_tables(layout, sin, cos),
        ),
    )


def rotation_rows(rotary_dim: int, max_wavelength: float, layout: str, scaling: dict | None):
    """Rows `(C, S)` for every position, with the frequencies `scaling` defines."""
    parameters = rope_parameters(rotary_dim, max_wavelength, scaling)
    table = rotation_table(
        rotary_dim, layout, parameters.inverse_frequencies, parameters.attention_factor
    )
    if parameters.long_inverse_frequencies is not None:
        long = rotation_table(
            rotary_dim, layout, parameters.long_inverse_frequencies, parameters.attention_factor
        )
        return SwitchByLength(table, long, parameters.switch_length)
    if parameters.dynamic_factor is not None:
        dynamic = DynamicRows(
            parameters.inverse_frequencies,
            parameters.dynamic_factor,
            parameters.switch_length,
            lambda sin, cos: channel_tables(layout, sin, cos),
        )
        return SwitchByLength(table, dynamic, parameters.switch_length)
    return table


def scaled_inverse_frequencies(
    rotary_dim: int, max_wavelength: float, scaling: dict | None, total_length: int | None
) -> np.ndarray:
    """The `ω` of `rotary_dim` channels under `scaling` when the total length is `total_length`.

    See `RotaryEmbedding.inverse_frequencies`: float64 (for dynamic scaling past
    `max_position_embeddings`, the float64 values the layers' two float32 words hold).
    """
    parameters = rope_parameters(rotary_dim, max_wavelength, scaling)
    past_switch = (
        total_length is not None
        and parameters.switch_length is not None
        and total_length > parameters.switch_length
    )
    if past_switch and parameters.long_inverse_frequencies is not None:
        return parameters.long_inverse_frequencies
    if past_switch and parameters.dynamic_factor is not None:
        from keras_posenc.dynamic_ntk import DynamicFrequencies

        return DynamicFrequencies(
            parameters.inverse_frequencies, parameters.dynamic_factor, parameters.switch_length
        ).host_inverse_frequencies(total_length)
    return parameters.inverse_frequencies
