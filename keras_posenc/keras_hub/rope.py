"""RoPE of a keras_hub attention layer: its settings, the package's exact tables, keras_hub's own.

keras_hub's `RotaryEmbedding` recomputes its angles in float32 on every call
(`float32(position) * float32(inverse_frequency)`, then `cos`/`sin` in float32); the
export uses the package's tables (float64, rounded once to float32). `keras_hub_tables`
reads the rows keras_hub's layer itself produces, by rotating a probe vector: the
bridge checks that the two agree to within float32's error of the angles (a setting
read wrongly shows as a difference of order 1), and docs/keras_hub.md measures what the
difference does to the logits.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from keras_posenc.export.decoder.description import Rope
from keras_posenc.export.errors import ExportError
from keras_posenc.frequencies import FrequencyTable
from keras_posenc.rope import rope_parameters

# float32's unit roundoff, and how many of them keras_hub's float32 angle may be off by,
# relative to the angle (power, product and the llama3 blend each round; sin and cos add
# one absolute unit). A setting read wrongly is off by a fraction of the angle itself.
_EPS32 = 2.0**-24
_ANGLE_UNITS = 64


@dataclasses.dataclass(frozen=True)
class ProportionalRotary:
    """Gemma 4's RoPE: keras_hub's `RotaryEmbedding` (`denominator_dim=head_dim`) applied
    to the first `rotary_dim / 2` channels of each half of the head, the rest passed
    through: transformers' `proportional` RoPE, a full-head table whose last pairs turn
    by 0 (cos 1, sin 0, exact)."""

    layer: object
    rotary_dim: int
    head_dim: int


def rope_settings(layer, owner: str) -> tuple[float, dict | None]:
    """`(max_wavelength, scaling)` of keras_hub rotary layer `layer`, scaling in
    transformers' form (what `keras_posenc.rope` reads), None for none.

    Raises:
        ExportError: a setting the export does not read (named with the layer).
    """
    if isinstance(layer, ProportionalRotary):
        return _proportional_settings(layer, owner)
    kind = type(layer).__name__
    if kind == "SmolLM3RotaryEmbedding":
        if layer.partial_rotary_factor != 1.0 or layer.attention_scaling != 1.0:
            raise ExportError(
                f"{owner}: partial_rotary_factor={layer.partial_rotary_factor} is not "
                "exported: keras_hub's SmolLM3 attention multiplies the whole head by its "
                "cos/sin rows, which are that fraction of the head wide, so it does not run "
                "with another value than 1.0."
            )
        return float(layer.rope_theta), None
    wavelength = float(layer.max_wavelength)
    if (layer.sequence_axis, layer.feature_axis) != (1, -1):
        raise ExportError(f"{owner}: a RoPE layer with other axes than (1, -1) is not exported.")
    if kind == "LlamaRotaryEmbedding":
        if layer.position_scaling_factor != 1.0:
            raise ExportError(
                f"{owner}: rope_position_scaling_factor={layer.position_scaling_factor} is "
                "not exported: keras_hub's LlamaRotaryEmbedding keeps it but never applies "
                "it (its inverse frequencies ignore it), so what the model computes and what "
                "its config says differ. Set it to 1.0, or use llama3 scaling."
            )
        if layer.low_freq_factor is None:
            return wavelength, None
        return wavelength, {
            "rope_type": "llama3",
            "factor": float(layer.frequency_adjustment_factor),
            "low_freq_factor": float(layer.low_freq_factor),
            "high_freq_factor": float(layer.high_freq_factor),
            "original_max_position_embeddings": int(layer.pretraining_sequence_length),
        }
    if kind == "Phi3SuScaledRotaryEmbedding":  # transformers' longrope
        return wavelength, {
            "rope_type": "longrope",
            "short_factor": [float(f) for f in layer.inverese_freq_short_factor],
            "long_factor": [float(f) for f in layer.inverese_freq_long_factor],
            "original_max_position_embeddings": int(layer.pretraining_sequence_length),
            "max_position_embeddings": int(layer.max_sequence_length),
        }
    if kind != "RotaryEmbedding":
        raise ExportError(f"{owner}: its RoPE layer {kind} is not one the export reads.")
    if layer.rope_type == "yarn" and getattr(layer, "denominator_dim", None) is None:
        return wavelength, yarn_scaling(layer)
    if layer.rope_type != "linear" or getattr(layer, "denominator_dim", None) is not None:
        raise ExportError(
            f"{owner}: keras_hub RoPE with rope_type={layer.rope_type!r} (or a "
            "denominator_dim) is not exported; 'linear' and 'yarn' are."
        )
    if layer.scaling_factor == 1.0:
        return wavelength, None
    return wavelength, {"rope_type": "linear", "factor": float(layer.scaling_factor)}


def _proportional_settings(rotary: ProportionalRotary, owner: str) -> tuple[float, dict | None]:
    layer = rotary.layer
    if type(layer).__name__ != "RotaryEmbedding" or layer.rope_type != "linear":
        raise ExportError(
            f"{owner}: its RoPE layer {type(layer).__name__} is not one the export reads."
        )
    if (layer.sequence_axis, layer.feature_axis) != (1, -1):
        raise ExportError(f"{owner}: a RoPE layer with other axes than (1, -1) is not exported.")
    if layer.denominator_dim not in (None, rotary.head_dim):
        raise ExportError(
            f"{owner}: a RoPE denominator_dim={layer.denominator_dim} other than head_dim "
            f"({rotary.head_dim}) is not exported."
        )
    wavelength, factor = float(layer.max_wavelength), float(layer.scaling_factor)
    if rotary.rotary_dim == rotary.head_dim:
        return wavelength, None if factor == 1.0 else {"rope_type": "linear", "factor": factor}
    return wavelength, {
        "rope_type": "proportional",
        "factor": factor,
        "partial_rotary_factor": rotary.rotary_dim / rotary.head_dim,
    }


def yarn_scaling(layer) -> dict:
    """keras_hub's YaRN (GPT-OSS) in transformers' form; its attention factor is
    `1 + 0.1 ln(factor)` whatever the factor (transformers': 1 for factors <= 1)."""
    factor = float(layer.scaling_factor)
    return {
        "rope_type": "yarn",
        "factor": factor,
        "beta_fast": float(layer.beta_fast),
        "beta_slow": float(layer.beta_slow),
        "original_max_position_embeddings": int(layer.original_max_position_embeddings),
        "truncate": bool(layer.truncate),
        "attention_factor": 1.0 + 0.1 * float(np.log(factor)),
    }


def exact_tables(head_dim: int, wavelength: float, scaling, max_length: int) -> Rope:
    """The package's tables: float64 angles, rounded once to float32."""
    parameters = rope_parameters(head_dim, wavelength, scaling)
    switch = parameters.switch_length
    if switch is not None and max_length > switch:
        raise ExportError(
            f"{scaling['rope_type']!r} RoPE (Phi-3's 'su') switches to its long factors once "
            f"the total length passes {switch}, and the keys already cached keep the short "
            "ones: no one cos/sin table (what GroupQueryAttention reads) gives those "
            f"rotations. Export with max_length <= {switch}, where the table is exact."
        )
    frequencies = FrequencyTable(parameters.inverse_frequencies, parameters.attention_factor)
    sin, cos = frequencies.host_sin_cos(np.arange(max_length))
    return Rope(cos=cos.astype(np.float32), sin=sin.astype(np.float32), interleaved=False)


def keras_hub_tables(layer, head_dim: int, max_length: int) -> Rope:
    """The rows keras_hub's rotary `layer` uses for positions `0..max_length-1`.

    keras_hub rotates halves: `x·cos + [-x2, x1]·sin`. For the probe `x = [1…1, 0…0]`
    that is `[cos_j, sin_j]`, each a product by 1 plus a product by 0: exact.
    """
    import keras

    if isinstance(layer, ProportionalRotary):  # the rotated pairs, then the unrotated ones
        rows = keras_hub_tables(layer.layer, layer.rotary_dim, max_length)
        rest = (max_length, (head_dim - layer.rotary_dim) // 2)
        return Rope(
            cos=np.concatenate([rows.cos, np.ones(rest, np.float32)], axis=1),
            sin=np.concatenate([rows.sin, np.zeros(rest, np.float32)], axis=1),
            interleaved=False,
        )
    half = head_dim // 2
    if type(layer).__name__ == "SmolLM3RotaryEmbedding":  # it returns its cos/sin rows
        probe = np.zeros((1, max_length, 1, head_dim), np.float32)
        cos, sin = (keras.ops.convert_to_numpy(t)[0, :, :half] for t in layer(probe, start_index=0))
        return Rope(cos=np.ascontiguousarray(cos), sin=np.ascontiguousarray(sin), interleaved=False)
    probe = np.zeros((1, max_length, 1, head_dim), np.float32)
    probe[..., :half] = 1.0
    rotated = keras.ops.convert_to_numpy(layer(probe, start_index=0))[0, :, 0]
    return Rope(
        cos=np.ascontiguousarray(rotated[:, :half], np.float32),
        sin=np.ascontiguousarray(rotated[:, half:], np.float32),
        interleaved=False,
    )


def table_difference(exact: Rope, keras_hub: Rope) -> float:
    """The largest |difference| of the two tables' entries."""
    return float(
        max(np.abs(exact.cos - keras_hub.cos).max(), np.abs(exact.sin - keras_hub.sin).max())
    )


def check_agreement(exact: Rope, keras_hub: Rope, angles_bound: float, owner: str) -> None:
    """Refuses tables that differ by more than float32's error of angles up to
    `angles_bound` (the largest angle): the settings were read wrongly."""
    bound = _EPS32 * (_ANGLE_UNITS * angles_bound + 4)
    difference = table_difference(exact, keras_hub)
    if not difference <= bound:
        raise ExportError(
            f"{owner}: the RoPE tables read from its settings differ from what keras_hub's "
            f"layer computes by {difference:.3g} (float32's error allows {bound:.3g}): the "
            "layer computes something the bridge does not read. Please report it."
        )
