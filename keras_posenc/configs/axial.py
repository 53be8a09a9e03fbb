"""transformers' `rope_type: "axial"`: the 2D RoPE of its vision encoders, as axial RoPE.

transformers 5.24 gives this type to the vision towers of Qwen3-VL, GLM-4V, PaddleOCR-VL
and dots3 (`default_rope_type = "axial"`; each module has its own
`compute_axial_rope_parameters`, not in `ROPE_INIT_FUNCTIONS`). With `d` the head size,
`ω_j = θ^(-2j/(d/2))` for `j < d/4`; the first `d/4` channel pairs turn by the row and the
next `d/4` by the column, in the half layout (`cat([freq_h, freq_w])` twice). That is
`RotaryEmbedding(axes_dims=(d/2, d/2), layout="half")` with positions `(tokens, 2)` as
`(row, column)`: the positions transformers' module takes.
"""

from __future__ import annotations

from keras_posenc.rope import checked_scaling

# Vision configs whose rope_type is "axial" when their config leaves it out.
AXIAL_MODEL_TYPES = (
    "qwen3_vl_vision",
    "qwen3_vl_moe_vision",
    "glm4v_vision",
    "glm4v_moe_vision",
    "paddleocr_vl_vision",
    "dots3_note_vision_encoder",
)


def _rope_type(config: dict) -> str | None:
    parameters = config.get("rope_parameters")
    if isinstance(parameters, dict):
        return parameters.get("rope_type", parameters.get("type"))
    return None


def is_axial(config: dict) -> bool:
    """Whether a config (dict) describes transformers' axial RoPE."""
    rope_type = _rope_type(config)
    if rope_type is None:
        return config.get("model_type") in AXIAL_MODEL_TYPES
    return rope_type == "axial"


def axial_arguments(config: dict, layer_type: str | None, layout: str | None) -> dict:
    """The `RotaryEmbedding` arguments of an axial config: `axes_dims=(d/2, d/2)`, half layout.

    Raises:
        ValueError: a layer type or a layout other than half asked for; rope parameters
            axial RoPE does not read (a scaling `factor`, a `partial_rotary_factor` other
            than 1: transformers' axial RoPE turns the whole head); a head size not a
            multiple of 4.
    """
    if layer_type is not None:
        raise ValueError(
            f"An axial (vision) RoPE config has one kind of layer; layer_type={layer_type!r} "
            "does not apply: leave it None."
        )
    if layout not in (None, "half"):
        raise ValueError(f"transformers' axial RoPE pairs channels by halves, not {layout!r}.")
    parameters = dict(config.get("rope_parameters") or {})
    parameters.setdefault("rope_type", "axial")
    parameters.setdefault("rope_theta", config.get("rope_theta", 10000.0))
    partial = parameters.pop("partial_rotary_factor", 1.0)
    if partial != 1.0:
        raise ValueError(
            f"partial_rotary_factor={partial!r}: transformers' axial RoPE turns the whole head "
            "and does not read it; remove it."
        )
    scaling = checked_scaling(parameters)  # names any key axial RoPE has not
    heads = config.get("num_heads", config.get("num_attention_heads"))
    head_dim = config.get("head_dim") or (
        config["hidden_size"] // heads if heads and "hidden_size" in config else None
    )
    if not isinstance(head_dim, int) or head_dim <= 0 or head_dim % 4:
        raise ValueError(
            "An axial RoPE config needs a head size (head_dim, or hidden_size / num_heads) "
            f"that is a multiple of 4 (two axes of channel pairs), got {head_dim!r}."
        )
    return {
        "max_wavelength": float(scaling["rope_theta"]),
        "layout": "half",
        "rotary_dim": None,
        "scaling": None,
        "axes_dims": (head_dim // 2, head_dim // 2),
    }
