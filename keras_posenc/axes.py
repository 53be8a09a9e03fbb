"""Positions on grids: coordinates per token, and the rows of encodings over several axes.

Images and video give each token coordinates (row, column[, frame]). Each axis is one
more use of the shared frequency table:

- `SinusoidalPositionalEncoding(axes=n)` spends `width / n` channels on each axis, each
  axis its own 1D encoding (`[encode(axis 0), encode(axis 1), ...]`, as MAE and ViT);
- `RotaryEmbedding(axes_dims=...)` (axial RoPE: FLUX, DINOv3, SAM) gives each axis its own
  channels and frequencies; `RotaryEmbedding(mrope_section=...)` (Qwen2-VL's M-RoPE)
  keeps the 1D frequencies and gives each channel pair the coordinate of one axis, in
  chunks (Qwen2-VL) or interleaved (Qwen3-VL).

Either way a channel pair `k` turns by `position[axis(k)] · ω_k`: `AxisPairs` is that
assignment. The helpers below make the coordinates people need: `grid_positions` for
patch grids and `multimodal_positions` for a text + image + text sequence.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
from keras import ops

from keras_posenc._checks import checked_positive_int, is_int
from keras_posenc._lazy import tricks
from keras_posenc.frequencies import FrequencyTable
from keras_posenc.rope import rope_parameters
from keras_posenc.rows import as_rows

# --------------------------------------------------------------------------------------
# Coordinates


def grid_positions(
    height: int, width: int, frames: int | None = None, class_token: bool = False
) -> np.ndarray:
    """The coordinates of a patch grid in row-major order, int32 `(tokens, axes)`.

    Axes are `(row, column)`, or `(frame, row, column)` when `frames` is given. With
    `class_token=True` a first token at coordinate 0 on every axis is prepended and the
    patches' coordinates start at 1, so that it shares no coordinate with a patch.

    Example:

    >>> grid_positions(2, 3).tolist()
    [[0, 0], [0, 1], [0, 2], [1, 0], [1, 1], [1, 2]]
    """
    sizes = [checked_positive_int(height, "height"), checked_positive_int(width, "width")]
    if frames is not None:
        sizes.insert(0, checked_positive_int(frames, "frames"))
    coordinates = np.stack(np.meshgrid(*map(np.arange, sizes), indexing="ij"), -1)
    coordinates = coordinates.reshape(-1, len(sizes))
    if class_token:
        coordinates = np.concatenate([np.zeros((1, len(sizes)), int), coordinates + 1])
    return coordinates.astype(np.int32)


def multimodal_positions(segments: Sequence[tuple[str, object]]) -> np.ndarray:
    """The 3-axis `(time, height, width)` positions of a text and image sequence, `(tokens, 3)`.

    As transformers' Qwen2-VL `get_rope_index` for images: text tokens carry one position
    on all three axes, counting on from the largest coordinate before them plus one; an
    image of `(t, h, w)` language-model patches (after the spatial merge) gets
    `start + (frame, row, column)` with `start` the next text position.

    Args:
        segments: `("text", number_of_tokens)` and `("image", (t, h, w))` in sequence order.

    Example:

    >>> multimodal_positions([("text", 2), ("image", (1, 2, 2)), ("text", 1)]).T.tolist()
    [[0, 1, 2, 2, 2, 2, 4], [0, 1, 2, 2, 3, 3, 4], [0, 1, 2, 3, 2, 3, 4]]
    """
    parts = []
    next_position = 0
    for kind, size in segments:
        if kind == "text":
            count = checked_positive_int(size, "the number of text tokens")
            run = next_position + np.arange(count)
            part = np.stack([run, run, run], -1)
        elif kind == "image":
            if not (isinstance(size, (tuple, list)) and len(size) == 3):
                raise ValueError(f"An image segment needs a (t, h, w) grid, got {size!r}.")
            t, h, w = (checked_positive_int(s, "an image grid size") for s in size)
            part = next_position + grid_positions(h, w, frames=t)
        else:
            raise ValueError(f"Unknown segment kind {kind!r}; expected 'text' or 'image'.")
        parts.append(part)
        next_position = int(part.max()) + 1
    if not parts:
        raise ValueError("multimodal_positions needs at least one segment.")
    return np.concatenate(parts).astype(np.int32)


# --------------------------------------------------------------------------------------
# Which axis each channel pair follows


def checked_axes_dims(axes_dims, rotary_dim: int | None) -> tuple[int, ...]:
    """`axes_dims` as a tuple of >= 2 positive even ints (summing to `rotary_dim` if known)."""
    if not isinstance(axes_dims, (tuple, list)) or len(axes_dims) < 2:
        raise ValueError(
            f"axes_dims must list the channels of each of two or more axes, got {axes_dims!r}."
        )
    if not all(is_int(d) and d > 0 and d % 2 == 0 for d in axes_dims):
        raise ValueError(
            f"axes_dims must be positive even integers (channels come in pairs), got {axes_dims!r}."
        )
    if rotary_dim is not None and sum(axes_dims) != rotary_dim:
        raise ValueError(
            f"axes_dims {tuple(axes_dims)} sum to {sum(axes_dims)}, but {rotary_dim} channels "
            "are rotated; make them sum to rotary_dim (or the head size)."
        )
    return tuple(int(d) for d in axes_dims)


def checked_mrope_section(section, rotary_dim: int | None) -> tuple[int, ...]:
    """`section` as a tuple of >= 2 non-negative ints (channel pairs, summing to `rotary_dim / 2`).

    An axis may have no pairs (a 0, as in small Qwen3.5 / Qwen2-VL configs: transformers
    gives it an empty chunk); it still has its column in the positions.
    """
    if not isinstance(section, (tuple, list)) or len(section) < 2:
        raise ValueError(
            f"mrope_section must list the channel pairs of each axis, got {section!r}."
        )
    if not all(is_int(s) and s >= 0 for s in section):
        raise ValueError(f"mrope_section must be non-negative integers, got {section!r}.")
    if sum(section) == 0:
        raise ValueError(
            f"mrope_section must give at least one axis a channel pair, got {section!r}."
        )
    if rotary_dim is not None and 2 * sum(section) != rotary_dim:
        raise ValueError(
            f"mrope_section {tuple(section)} counts {sum(section)} channel pairs, but "
            f"{rotary_dim} channels are rotated ({rotary_dim // 2} pairs); make it sum to "
            "half of rotary_dim (or of the head size)."
        )
    return tuple(int(s) for s in section)


class AxisPairs:
    """Channel pair `k` turns by `position[axis[k]] · omega[k]`.

    Args:
        omega: float64 frequencies, one per channel pair, in channel-pair order.
        axis: the axis each pair takes its coordinate from.
        scale: multiplies every value (RoPE's attention factor).
        axes: the number of axes of the positions (default: the largest in `axis`, + 1);
            an axis no pair takes has no table.
    """

    def __init__(
        self, omega: np.ndarray, axis: np.ndarray, scale: float = 1.0, axes: int | None = None
    ):
        self.axes = int(axis.max()) + 1 if axes is None else axes
        self.used_axes = [a for a in range(self.axes) if np.any(axis == a)]
        self.tables = [FrequencyTable(omega[axis == a], scale) for a in self.used_axes]
        # Pairs grouped by axis, then put back in channel-pair order.
        grouped = np.concatenate([np.flatnonzero(axis == a) for a in self.used_axes])
        order = np.argsort(grouped)
        self.order = None if np.array_equal(order, np.arange(len(order))) else order

    @classmethod
    def axial(cls, axes_dims: Sequence[int], max_wavelength: float) -> AxisPairs:
        """Each axis its own channels and frequencies `inverse_frequencies(dims[a])`."""
        from keras_posenc.frequencies import inverse_frequencies

        omega = np.concatenate([inverse_frequencies(d, max_wavelength) for d in axes_dims])
        axis = np.repeat(np.arange(len(axes_dims)), [d // 2 for d in axes_dims])
        return cls(omega, axis)

    @classmethod
    def mrope(
        cls, omega: np.ndarray, section: Sequence[int], interleaved: bool, scale: float = 1.0
    ) -> AxisPairs:
        """The 1D frequencies, pairs taken by axis in chunks (Qwen2-VL) or interleaved (Qwen3-VL).

        Interleaved: pair `k` takes axis `k mod 3` while `k < 3 · section[that axis]`,
        else axis 0 (Qwen3-VL's `apply_interleaved_mrope`, for any number of axes).
        """
        pairs = len(omega)
        if interleaved:
            axis = np.zeros(pairs, int)
            for a in range(1, len(section)):
                chosen = np.arange(a, min(len(section) * section[a], pairs), len(section))
                axis[chosen] = a
        else:
            axis = np.repeat(np.arange(len(section)), section)
        return cls(omega, axis, scale, axes=len(section))

    def stored_arrays(self) -> dict[str, np.ndarray]:
        """The host arrays an export holds as constants, by name: each axis's split tables
        (`axis{a}_fine_sin`, ...; every coarse row, as `sin_cos` reads them unbounded)."""
        names = ("fine_sin", "fine_cos", "coarse_sin", "coarse_cos")
        return {
            f"axis{a}_{name}": constant.array
            for a, table in zip(self.used_axes, self.tables, strict=True)
            for name, constant in zip(names, table._split_tables, strict=True)
        }

    def sin_cos(self, positions) -> tuple:
        """`(sin, cos)` per pair for positions `(..., axes)`: shape `(..., pairs)`."""
        parts = [
            table.sin_cos(positions[..., a])
            for a, table in zip(self.used_axes, self.tables, strict=True)
        ]
        sin = ops.concatenate([p[0] for p in parts], -1)
        cos = ops.concatenate([p[1] for p in parts], -1)
        if self.order is not None:
            take = tricks().take
            sin = take(sin, self.order.astype(np.int32), -1)
            cos = take(cos, self.order.astype(np.int32), -1)
        return sin, cos


class AxesRows:
    """Rows for coordinates `(..., axes)`, for `position_rows(..., axes=n)`.

    `sin_cos(positions)` gives the `(sin, cos)` of every pair and `make_rows` turns them
    into the layer's rows. A run from `start_index` puts every axis at the same position
    (a text token of a multimodal sequence).
    """

    def __init__(self, sin_cos: Callable, make_rows: Callable, axes: int):
        self.sin_cos = sin_cos
        self.make_rows = make_rows
        self.axes = axes

    def gather(self, positions) -> tuple:
        return tuple(self.make_rows(*self.sin_cos(positions)))

    def position_tables(self) -> tuple[AxesRows, ...]:
        """`(self,)` when the rows come from an `AxisPairs`' tables (what an export stores,
        `stored_arrays(bound)`, for the audit of `export.verify.tables`), else `()`."""
        return (self,) if isinstance(getattr(self.sin_cos, "__self__", None), AxisPairs) else ()

    def stored_arrays(self, bound: int | None = None) -> dict[str, np.ndarray]:
        """The split tables of every axis (see `AxisPairs.stored_arrays`), whatever `bound`:
        the rows of coordinates are gathered from whole tables."""
        # `sin_cos` is `AxisPairs.sin_cos`, bound to the pairs whose tables it reads.
        return self.sin_cos.__self__.stored_arrays()

    def slice(self, start, length, combine=as_rows, traced=None):
        run = ops.arange(length, dtype="int32") + start
        return combine(*self.gather(ops.stack([run] * self.axes, -1)))


def axes_rotation_rows(
    rotary_dim: int,
    max_wavelength: float,
    scaling: dict | None,
    axes_dims: tuple[int, ...] | None,
    mrope_section: tuple[int, ...] | None,
    mrope_interleaved: bool,
    make_rows: Callable,
) -> AxesRows:
    """RoPE's rows `make_rows(sin, cos)` for coordinates `(..., axes)`: axial RoPE or M-RoPE."""

    if axes_dims is not None:
        pairs = AxisPairs.axial(axes_dims, max_wavelength)
    else:
        parameters = rope_parameters(rotary_dim, max_wavelength, scaling)
        if parameters.switch_length is not None:
            raise ValueError(
                f"scaling of rope_type {scaling['rope_type']!r} switches frequencies by length, "
                "which multi-axis RoPE does not do; use no scaling or a static one (linear, "
                "yarn, llama3) with mrope_section."
            )
        pairs = AxisPairs.mrope(
            parameters.inverse_frequencies,
            mrope_section,
            mrope_interleaved,
            parameters.attention_factor,
        )
    return AxesRows(pairs.sin_cos, make_rows, pairs.axes)
