"""How a layer's rows come from `(sin, cos)` per frequency pair, for the host and for `keras.ops`.

One definition serves the host tables (numpy, on the float64 values before their one
rounding) and the rows JAX and PyTorch compute in their graphs (`keras.ops`): `xp` is
either, whose `stack`, `concatenate`, `split` and `reshape` agree. TensorFlow's graphs lay
the rows out with their own ops, shaped for the converters
(`keras_posenc.backend.tensorflow.encoding`,
`channel_tables`); the values are the same, the moves being exact.
"""

from __future__ import annotations

import numpy as np


def interleave(a, b, xp=np):
    """`[a0, b0, a1, b1, ...]` along the last axis: neighbours share a frequency."""
    pairs = xp.stack([a, b], axis=len(a.shape))
    return xp.reshape(pairs, (*a.shape[:-1], 2 * a.shape[-1]))


def concat(a, b, xp=np):
    """`[a0, a1, ..., b0, b1, ...]` along the last axis."""
    return xp.concatenate([a, b], axis=-1)


# The sinusoidal encoding's layouts: Vaswani's (sin and cos of a frequency side by side)
# and tensor2tensor's, fairseq's and Whisper's (all sines, then all cosines).
SINUSOIDAL = {"interleaved": interleave, "concat": concat}


def encoding(layout: str, sin, cos, axes: int = 1, xp=np):
    """The sinusoidal encoding of `(sin, cos)` `(..., pairs)`: `(..., 2·pairs)`, each of
    `axes` blocks of pairs laid out on its own (`[encode(axis 0), encode(axis 1), ...]`)."""
    lay_out = SINUSOIDAL[layout]
    if axes == 1:
        return lay_out(sin, cos, xp)
    blocks = zip(xp.split(sin, axes, -1), xp.split(cos, axes, -1), strict=True)
    return xp.concatenate([lay_out(s, c, xp) for s, c in blocks], -1)


def channel_tables(layout: str, sin, cos, xp=np) -> tuple:
    """RoPE's `(C, S)` per channel from `(sin, cos)` per pair: `C = cos` and `S = ∓sin`
    (minus on a pair's first channel), paired `k` with `k + D/2` (`"half"`) or `2k` with
    `2k + 1` (`"interleaved"`)."""
    lay_out = concat if layout == "half" else interleave
    return lay_out(cos, cos, xp), lay_out(-sin, sin, xp)


def pair_view(layout: str, width: int) -> tuple[list[int], int]:
    """`(shape, axis)`: `width` channels viewed as `shape`, which holds the two channels of
    each rotation pair along `axis`. `"half"` pairs channel `k` with `k + width/2`: `(2,
    width/2)`, pairs along axis 0; `"interleaved"` pairs `2k` with `2k + 1`: `(width/2, 2)`,
    along axis 1."""
    half = width // 2
    return ([2, half], 0) if layout == "half" else ([half, 2], 1)
