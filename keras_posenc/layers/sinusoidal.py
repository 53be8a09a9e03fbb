"""`SinusoidalPositionalEncoding`: adds the fixed sin/cos encoding of Vaswani et al. (2017)."""

from __future__ import annotations

import keras
import numpy as np

from keras_posenc.backend.lazy import tricks
from keras_posenc.frequencies import (
    FREQUENCY_SPACINGS,
    MAX_POSITIONS,
    FrequencyTable,
    PositionTable,
    held_tables,
    inverse_frequencies,
    position_table,
)
from keras_posenc.layers.checks import (
    checked_call_input,
    checked_choice,
    checked_even_width,
    checked_float_policy,
    checked_int,
    checked_max_wavelength,
    checked_positive_int,
)
from keras_posenc.layers.host_integers import RefusesHostIntegersPastInt32
from keras_posenc.tables import layouts
from keras_posenc.tables.axes import AxesRows, AxisPairs
from keras_posenc.tables.positions import position_rows, static_dim

LAYOUTS = ("interleaved", "concat")


def encoding_table(
    width: int, max_wavelength: float, layout: str, frequency_spacing: str = "vaswani"
) -> PositionTable:
    """The shared `PositionTable` whose rows are the encoding `p_i`."""
    return position_table(
        ("sinusoidal", width, max_wavelength, layout, frequency_spacing),
        lambda: PositionTable(
            FrequencyTable(inverse_frequencies(width, max_wavelength, frequency_spacing)),
            lambda sin, cos: (tricks().encoding(layout, sin, cos),),
            lambda sin, cos: (layouts.encoding(layout, sin, cos),),
        ),
    )


def axes_encoding_rows(
    width: int, axes: int, max_wavelength: float, layout: str, frequency_spacing: str
) -> AxesRows:
    """Rows `[encode(axis 0), encode(axis 1), ...]` of `width / axes` channels each."""
    omega = inverse_frequencies(width // axes, max_wavelength, frequency_spacing)
    pairs = AxisPairs(np.tile(omega, axes), np.repeat(np.arange(axes), len(omega)))
    return AxesRows(
        pairs.sin_cos, lambda sin, cos: (tricks().encoding(layout, sin, cos, axes),), axes
    )


def sinusoidal_table(
    length: int,
    width: int,
    max_wavelength: float = 10000.0,
    layout: str = "interleaved",
    frequency_spacing: str = "vaswani",
) -> np.ndarray:
    """The encoding `P` for positions `0 .. length - 1` as a float32 numpy array `(length, width)`.

    Each value is the float64 formula rounded once to float32. `layout` and
    `frequency_spacing` are those of `SinusoidalPositionalEncoding`.
    """
    length = checked_int(length, "length", minimum=0)
    checked_choice("layout", layout, LAYOUTS)
    frequencies = FrequencyTable(
        inverse_frequencies(checked_even_width(width), max_wavelength, frequency_spacing)
    )
    sin, cos = frequencies.host_sin_cos(np.arange(length))
    return layouts.encoding(layout, sin, cos).astype(np.float32)


@keras.saving.register_keras_serializable(package="keras_posenc")
class SinusoidalInitializer(keras.initializers.Initializer):
    """Initializes a `(length, width)` table with the sinusoidal encoding.

    `LearnedPositionalEmbedding(..., embeddings_initializer="sinusoidal")` uses it, so a
    learned table can start from the fixed encoding.

    Args:
        max_wavelength: the base of the frequencies.
        layout: `"interleaved"` or `"concat"`.
        frequency_spacing: `"vaswani"` or `"tensor2tensor"` (see `SinusoidalPositionalEncoding`).
    """

    def __init__(
        self,
        max_wavelength: float = 10000.0,
        layout: str = "interleaved",
        frequency_spacing: str = "vaswani",
    ):
        self.max_wavelength = checked_max_wavelength(max_wavelength)
        self.layout = checked_choice("layout", layout, LAYOUTS)
        self.frequency_spacing = checked_choice(
            "frequency_spacing", frequency_spacing, FREQUENCY_SPACINGS
        )

    def __call__(self, shape, dtype=None):
        if len(shape) != 2:
            raise ValueError(f"SinusoidalInitializer makes (length, width) tables, got {shape}.")
        table = sinusoidal_table(
            shape[0], shape[1], self.max_wavelength, self.layout, self.frequency_spacing
        )
        return keras.ops.cast(table, dtype or "float32")

    def get_config(self) -> dict:
        return {
            "max_wavelength": self.max_wavelength,
            "layout": self.layout,
            "frequency_spacing": self.frequency_spacing,
        }


@keras.saving.register_keras_serializable(package="keras_posenc")
class SinusoidalPositionalEncoding(RefusesHostIntegersPastInt32, keras.layers.Layer):
    """Adds the fixed sinusoidal position encoding of Vaswani et al. (2017) to its input.

    With `ω_k = max_wavelength^(-2k/width)`, position `i` gets
    `p[i, 2k] = sin(i·ω_k)` and `p[i, 2k+1] = cos(i·ω_k)` (`layout="interleaved"`), or
    `[sin(i·ω_0), ..., cos(i·ω_0), ...]` (`layout="concat"`), and the layer returns
    `inputs + P`. The table is computed in float64 on the host and rounded once to float32
    (exact at every position below 2^24), whatever the dtype policy; only the result is cast.
    Checkpoints trained with tensor2tensor, fairseq or Whisper use `layout="concat"` with
    `frequency_spacing="tensor2tensor"` (`ω_k = max_wavelength^(-k/(width/2 - 1))`).

    Example:

    >>> tokens = keras.layers.Embedding(1000, 64)(np.array([[3, 1, 4, 1, 5]]))
    >>> encoded = SinusoidalPositionalEncoding()(tokens)
    >>> tuple(encoded.shape)
    (1, 5, 64)

    Args:
        max_wavelength: the base of the frequencies (10000 in the paper).
        layout: `"interleaved"` (sin/cos alternate) or `"concat"` (all sin, then all cos).
        frequency_spacing: `"vaswani"` (`ω_k = max_wavelength^(-2k/width)`, the paper) or
            `"tensor2tensor"` (`max_wavelength^(-k/(width/2 - 1))`: the last pair reaches
            exactly `1/max_wavelength`; tensor2tensor, fairseq, Whisper).
        axes: the coordinates per position (2 for image patches, 3 for video): the width
            is split evenly, each axis its own encoding of `width / axes` channels
            (`[encode(axis 0), encode(axis 1), ...]`; MAE's 2D table is
            `layout="concat"` with positions `(column, row)`). Positions are then
            required, `(sequence, axes)` or `(batch, sequence, axes)` (see
            `keras_posenc.grid_positions`).
        **kwargs: base layer arguments (`name`, `dtype`, ...).

    Call arguments:
        inputs: float tensor `(batch, sequence, width)`, `width` even.
        positions: optional integer tensor `(sequence,)` or `(batch, sequence)`.
        start_index: the position of the first step when `positions` is not given: a Python
            int or a scalar int tensor (decoding with a cache). `start_index=s` is
            `positions=range(s, s + sequence)`.

    Input shape: `(batch, sequence, width)`. Output shape: the same. A Keras mask passes through.
    """

    def __init__(
        self,
        max_wavelength: float = 10000.0,
        layout: str = "interleaved",
        frequency_spacing: str = "vaswani",
        axes: int = 1,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.axes = checked_positive_int(axes, "axes")
        self.max_wavelength = checked_max_wavelength(max_wavelength)
        self.layout = checked_choice("layout", layout, LAYOUTS)
        self.frequency_spacing = checked_choice(
            "frequency_spacing", frequency_spacing, FREQUENCY_SPACINGS
        )
        checked_float_policy(self)
        self.supports_masking = True

    def build(self, input_shape) -> None:
        if len(input_shape) != 3:
            raise ValueError(
                "SinusoidalPositionalEncoding expects inputs of shape (batch, sequence, width), "
                f"got shape {tuple(input_shape)}."
            )
        width = checked_even_width(input_shape[-1], "the input width (last axis)")
        self._table_width = width
        if self.axes == 1:
            self._table = encoding_table(
                width, self.max_wavelength, self.layout, self.frequency_spacing
            )
        elif width % (2 * self.axes):
            raise ValueError(
                f"A {self.axes}-axis encoding splits the width evenly into sin/cos pairs per "
                f"axis: the width must be a multiple of {2 * self.axes}, got {width}."
            )
        else:
            self._table = axes_encoding_rows(
                width, self.axes, self.max_wavelength, self.layout, self.frequency_spacing
            )
        super().build(input_shape)

    def call(self, inputs, positions=None, start_index=0):
        t = tricks()
        checked_call_input(self, inputs, 3, {-1: self._table_width})
        if self.axes > 1 and positions is None:
            raise ValueError(
                f"A {self.axes}-axis encoding needs positions of shape (sequence, {self.axes}) "
                f"or (batch, sequence, {self.axes}), one coordinate per axis; for a patch grid "
                "use positions=keras_posenc.grid_positions(height, width)."
            )
        outputs = position_rows(
            self._table,
            static_dim(inputs, 1),
            positions,
            start_index,
            limit=MAX_POSITIONS,
            limit_hint="the encoding is exact only below that.",
            combine=lambda encoding: t.add_rounded_once(inputs, encoding),
            batch=static_dim(inputs, 0),
            axes=self.axes,
            traced=t.is_traced(inputs),
        )
        t.keep_static_shape(outputs, inputs.shape)
        return outputs

    def position_tables(self) -> tuple[PositionTable, ...]:
        """The host position tables this layer reads its rows from, as a `PositionTable`.

        Empty before `build`, and where the rows are made otherwise (several axes). What an export
        holds of each table: `PositionTable.stored_arrays(bound)`; layers of one
        configuration share one table.
        """
        return held_tables(getattr(self, "_table", None))

    def held_rows(self):
        """The rows of its positions (None before `build`), for an export's table audit."""
        return getattr(self, "_table", None)

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self) -> dict:
        config = super().get_config()
        config.update(
            {
                "max_wavelength": self.max_wavelength,
                "layout": self.layout,
                "frequency_spacing": self.frequency_spacing,
                "axes": self.axes,
            }
        )
        return config
