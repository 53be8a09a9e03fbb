"""The `rope_*` options of the rotary attention layers: each a `RotaryEmbedding` argument."""

from __future__ import annotations

# The RoPE options' names before they shared the `rope_` prefix: still read by the
# constructors and `from_config` (so `.keras` files saved before the rename load).
OLD_ROPE_NAMES = {
    "max_wavelength": "rope_max_wavelength",
    "rotary_layout": "rope_layout",
    "rotary_dim": "rope_dim",
    "rotary_scaling": "rope_scaling",
}
# Each `rope_*` option of the attention layers: the `RotaryEmbedding` argument it is.
ROPE_OPTIONS = {
    "rope_max_wavelength": "max_wavelength",
    "rope_layout": "layout",
    "rope_dim": "rotary_dim",
    "rope_scaling": "scaling",
    "rope_axes_dims": "axes_dims",
    "rope_mrope_section": "mrope_section",
    "rope_mrope_interleaved": "mrope_interleaved",
}
ROPE_DEFAULTS = {
    "rope_max_wavelength": 10000.0,
    "rope_layout": "half",
    "rope_dim": None,
    "rope_scaling": None,
    "rope_axes_dims": None,
    "rope_mrope_section": None,
    "rope_mrope_interleaved": False,
}


def renamed_rope_options(options: dict, kwargs: dict) -> dict:
    """`options` (the `rope_*` arguments) with any old name in `kwargs` moved in (popped)."""
    options = dict(options)
    for old, new in OLD_ROPE_NAMES.items():
        if old not in kwargs:
            continue
        value = kwargs.pop(old)
        if options[new] != ROPE_DEFAULTS[new] and options[new] != value:
            raise ValueError(
                f"Got both {new}={options[new]!r} and its old name {old}={value!r}; "
                f"pass {new} only."
            )
        options[new] = value
    return options


def is_nope(rope_options: dict) -> bool:
    """Whether the `rope_*` options describe a NoPE layer (`rope_dim=0`: nothing rotated);
    a ValueError where they also set some other RoPE option (it would be ignored)."""
    rope_dim = rope_options["rope_dim"]
    if isinstance(rope_dim, bool) or rope_dim != 0:
        return False
    others = {
        name: value
        for name, value in rope_options.items()
        if name != "rope_dim" and value != ROPE_DEFAULTS[name]
    }
    if others:
        raise ValueError(
            f"rope_dim=0 makes a NoPE layer, which rotates nothing; {others} would be "
            "ignored: leave them out."
        )
    return True
