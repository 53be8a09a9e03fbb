"""keras_hub's rotary layers: their settings, the package's exact tables, keras_hub's own rows.

keras_hub's `RotaryEmbedding` recomputes its angles in float32 on every call
(`float32(position) * float32(inverse_frequency)`, then `cos`/`sin` in float32); the
export uses the package's tables (float64, rounded once to float32). `probe_rows`
reads the rows keras_hub's layer itself produces, by rotating a probe vector: the
bridge checks that the two agree to within float32's error of the angles (a setting
read wrongly shows as a difference of order 1), and docs/keras_hub.md measures what the
difference does to the logits. The rotary classes of one family (Llama 3's, Phi-3's,
SmolLM3's, Gemma 4's proportional RoPE) are read in its module (`HubFamily.rotaries`).
"""

from __future__ import annotations

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


def checked_wavelength(layer, owner: str) -> float:
    """`max_wavelength` of a keras_hub rotary layer that rotates axis -1 of `(batch,
    sequence, heads, head_dim)` inputs (the only axes the export reads)."""
    wavelength = float(layer.max_wavelength)
    if (layer.sequence_axis, layer.feature_axis) != (1, -1):
        raise ExportError(f"{owner}: a RoPE layer with other axes than (1, -1) is not exported.")
    return wavelength


def rotary_embedding_settings(layer, owner: str) -> tuple[float, dict | None]:
    """`(max_wavelength, scaling)` of keras_hub's own `RotaryEmbedding` (linear or YaRN
    scaling), scaling in transformers' form, None for none; the reader of every rotary
    class no `HubFamily.rotaries` names.

    Raises:
        ExportError: another class, or a setting the export does not read (named).
    """
    kind = type(layer).__name__
    wavelength = checked_wavelength(layer, owner)
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


def probe_rows(layer, head_dim: int, max_length: int) -> Rope:
    """The rows keras_hub's rotary `layer` uses for positions `0..max_length-1`.

    keras_hub rotates halves: `x·cos + [-x2, x1]·sin`. For the probe `x = [1…1, 0…0]`
    that is `[cos_j, sin_j]`, each a product by 1 plus a product by 0: exact.
    """
    import keras

    half = head_dim // 2
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
