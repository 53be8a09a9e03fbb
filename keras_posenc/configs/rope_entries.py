"""The rope parameter dicts of a transformers config, read as transformers 5 reads them.

`rope_entries` gives one transformers-5 `rope_parameters` dict per layer type (or one for
all layers) from any form of a config; `entry_arguments` turns one of them into the base, the
rotated fraction and the `scaling` dict of a `RotaryEmbedding`.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping

from keras_posenc._checks import short_repr
from keras_posenc.axes import checked_mrope_section
from keras_posenc.configs.family import Family
from keras_posenc.rope import ROPE_TYPES, checked_scaling, find_rope_type


def is_nested(parameters: Mapping) -> bool:
    """Whether `parameters` holds one rope dict per layer type (transformers 5's nesting)."""
    return bool(parameters) and all(
        v is None or isinstance(v, Mapping) for v in parameters.values()
    )


def rope_entries(
    config: dict, family: Family, consumed: set, head_dim: int
) -> dict[str | None, dict | None]:
    """The rope parameter dicts (transformers 5 form) by layer type, None for all layers."""
    consumed.update({"rope_parameters", "rope_scaling"})
    parameters = config.get("rope_parameters") or None
    scaling = config.get("rope_scaling") or None
    if parameters is not None and scaling is not None and parameters != scaling:
        raise ValueError(
            "The config has both 'rope_parameters' and 'rope_scaling', and they differ: keep one "
            "(transformers 5 reads 'rope_scaling' first)."
        )
    parameters = scaling if scaling is not None else parameters
    if parameters is None and family.defaults is not None:
        parameters = copy.deepcopy(dict(family.defaults))  # what its config class sets
    if parameters is not None and not isinstance(parameters, Mapping):
        raise ValueError(f"config's RoPE parameters must be a dict, got {short_repr(parameters)}.")
    per_type = isinstance(family.theta, Mapping)
    if parameters is not None and is_nested(parameters):
        entries = {key: None if v is None else dict(v) for key, v in parameters.items()}
    elif per_type:
        # transformers-4 form of a local/global family: one rope_scaling, per-type thetas.
        entries = {key: {} for key in family.theta}
        for key in family.scaling_types or entries:
            entries[key].update(parameters or {})
    else:
        entries = {None: dict(parameters or {})}
    live = {name: entry for name, entry in entries.items() if entry is not None}
    _no_null_factor(config, family)
    top = dict(config)
    if family.rotary_dim_key:
        # MiniMaxM2Config: partial_rotary_factor defaults to rotary_dim / head_dim.
        consumed.add("rotary_dim")
        if top.get("rotary_dim") is not None and top.get("partial_rotary_factor") is None:
            top["partial_rotary_factor"] = top["rotary_dim"] / head_dim
    # transformers' order: the family's own keys, then the generic top-level ones, then the
    # family's defaults. A generic key that the family's own keys replace is not read by
    # transformers: it is refused, naming the family's own key.
    for key, (layer_type, rope_key) in family.legacy.items():
        consumed.add(key)
        if config.get(key) is not None:
            for name, entry in live.items():
                if layer_type is None or name == layer_type:
                    entry.setdefault(rope_key, config[key])
    for key in ("rope_theta", "partial_rotary_factor"):
        own = [name for name, (_, rope_key) in family.legacy.items() if rope_key == key]
        if own and key not in family.legacy:
            if config.get(key) is not None:
                names = " / ".join(map(repr, own))
                raise ValueError(
                    f"This family reads {names}, not {key!r} (transformers ignores it): give "
                    f"the value as {names}, or remove {key!r}."
                )
            continue
        consumed.add(key)
        if top.get(key) is not None and key not in family.legacy:
            for entry in live.values():
                entry.setdefault(key, top[key])
    for name, entry in live.items():
        theta = family.theta.get(name) if per_type else family.theta
        if theta is not None:
            entry.setdefault("rope_theta", theta)
        entry.setdefault("partial_rotary_factor", family.partial)
    return entries


def _no_null_factor(config: dict, family: Family) -> None:
    """Refuses a null top-level `partial_rotary_factor` of a family whose attention reads it.

    transformers' config classes keep the null (their default is a `setdefault`): phi and
    stablelm then fail, phi3's validation refuses it, and the others drop it and rotate the
    whole head, whatever the family's default. gpt_neox reads `rotary_pct` instead, and the
    whole-head families never read it: there it is ignored, as transformers does.
    """
    legacy = any(rope_key == "partial_rotary_factor" for _, rope_key in family.legacy.values())
    if "partial_rotary_factor" in config and config["partial_rotary_factor"] is None:
        if family.reads_partial and not legacy:
            raise ValueError(
                "config['partial_rotary_factor'] is null, which transformers refuses for this "
                "family or reads as the whole head (not its default of "
                f"{family.partial}): give the fraction of each head that rotates, or remove the "
                "key for the default."
            )


def _ntk_alpha(scaling: dict, head_dim: int) -> dict:
    """Hunyuan's NTK-alpha, a fixed base `θ·α^(d/(d-2))`, as plain frequencies."""
    alpha = scaling["alpha"]
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not alpha > 0:
        raise ValueError(f"The rope parameters' 'alpha' must be a positive number, got {alpha!r}.")
    theta = scaling["rope_theta"] * float(alpha) ** (head_dim / (head_dim - 2))
    kept = {key: scaling[key] for key in ("partial_rotary_factor",) if key in scaling}
    return {"rope_type": "default", "rope_theta": theta, **kept}


def _phi3_names(scaling: dict) -> None:
    """Phi3Config's renaming, in place: early Phi-3 configs call longrope "su" (or "yarn")."""
    names = {scaling.get("type"), scaling.get("rope_type")}
    if "su" in names and "original_max_position_embeddings" not in scaling:
        # Phi3Config validates before it renames, and copies a top-level length only into
        # the types it knows by then: an "su" without its own length is refused.
        raise ValueError(
            "phi3 rope_scaling type 'su' needs 'original_max_position_embeddings' inside "
            "rope_scaling (transformers' Phi3Config refuses it without, even with a top-level "
            "one): add it there, or name the type 'longrope'."
        )
    for key in ("type", "rope_type"):
        if scaling.get(key) in ("su", "yarn"):
            scaling[key] = "longrope"


def entry_arguments(
    entry: dict, config: dict, family: Family, original_top: bool, head_dim: int
) -> tuple[float, float, dict | None]:
    """`(theta, partial_rotary_factor, scaling dict or None)` of one rope parameter dict.

    For `proportional` the factor stays in the scaling dict (it chooses the pairs that turn
    within a rotation of the whole head) and the partial factor returned is 1.
    """
    scaling = dict(entry)
    for key in ("mrope_section", "mrope_interleaved"):
        scaling.pop(key, None)  # read by _mrope
    if family.longrope_aliases:
        _phi3_names(scaling)
    if scaling.get("rope_type", scaling.get("type")) == "mrope":
        # transformers 4's Qwen2-VL configs name the plain frequencies "mrope".
        scaling.pop("type", None)
        scaling["rope_type"] = "default"
    if "type" in scaling and scaling.setdefault("rope_type", scaling["type"]) == scaling["type"]:
        del scaling["type"]  # when they differ, checked_scaling names both
    rope_type = scaling.setdefault("rope_type", "default")
    if "rope_theta" not in scaling:
        raise ValueError("The config gives no 'rope_theta' for this layer.")
    if family.ntk_alpha and rope_type == "dynamic" and scaling.get("alpha"):
        scaling = _ntk_alpha(scaling, head_dim)
        rope_type = "default"
    kind = find_rope_type(rope_type)  # None for a type checked_scaling refuses below
    if kind is not None and kind.needs_original_length:
        # As transformers' standardize_rope_params: a top-level original length (Phi-3, whose
        # config class always has one) wins over the rope parameters' own.
        top = config.get("original_max_position_embeddings", family.original_length)
        if original_top and top is not None:
            scaling["original_max_position_embeddings"] = top
        elif "max_position_embeddings" in config:
            scaling.setdefault(
                "original_max_position_embeddings", config["max_position_embeddings"]
            )
    if kind is not None and (
        kind.needs_max_length or (kind.factor_from_lengths and scaling.get("factor") is None)
    ):
        # transformers takes this one from the config, not from the rope parameters.
        if "max_position_embeddings" not in config:
            raise ValueError(
                f"rope_type {rope_type!r} needs the config's 'max_position_embeddings'."
            )
        top = config["max_position_embeddings"]
        if scaling.setdefault("max_position_embeddings", top) != top:
            raise ValueError(
                "The rope parameters' 'max_position_embeddings' differs from the config's; "
                "transformers uses the config's: remove the inner one."
            )
    scaling = checked_scaling(scaling)
    theta = scaling.pop("rope_theta")
    if ROPE_TYPES[rope_type].partial_in_scaling:
        return theta, 1.0, scaling
    partial = scaling.pop("partial_rotary_factor", 1.0)
    return theta, partial, None if rope_type == "default" else scaling


def mrope_arguments(entry: dict, family: Family, rotary_dim: int) -> dict:
    """`mrope_section` / `mrope_interleaved` arguments of a multimodal RoPE family, else {}.

    The section must fill the `rotary_dim` rotated channels: transformers fails on one that
    does not (or, for Qwen3-VL's interleaving, cuts an axis short), and so would the layer.
    """
    if family.mrope is None:
        if "mrope_section" in entry:
            raise ValueError(
                "The config has an 'mrope_section', but its model_type uses 1D RoPE; "
                "give the model_type of the multimodal model."
            )
        return {}
    interleaved = entry.get("mrope_interleaved", family.mrope_interleaved)
    if bool(interleaved) != family.mrope_interleaved:
        raise ValueError(
            f"'mrope_interleaved': {interleaved!r} differs from what this family's code does "
            f"({family.mrope_interleaved}); transformers ignores it: remove it."
        )
    try:
        section = checked_mrope_section(entry.get("mrope_section", family.mrope), None)
    except ValueError as error:
        # An integer is not per-axis pair counts (transformers would split cos/sin into
        # chunks of that size instead): say the form, with this family's default.
        raise ValueError(
            f"The config's {str(error).rstrip('.')}: give a list of pair counts per axis "
            f"(temporal, height, width) such as {list(family.mrope)}, summing to half the "
            "rotated channels."
        ) from None
    if 2 * sum(section) != rotary_dim:
        whose = "The config's" if "mrope_section" in entry else "The family's default"
        raise ValueError(
            f"{whose} mrope_section {section} counts {sum(section)} channel pairs, but its "
            f"heads rotate {rotary_dim} channels ({rotary_dim // 2} pairs): give an "
            f"mrope_section that sums to {rotary_dim // 2} (pairs per axis: temporal, height, "
            "width)."
        )
    return {"mrope_section": section, "mrope_interleaved": family.mrope_interleaved}


def whole_head_factor(
    model_type: str, partial: float, scaling: dict | None, head_dim: int
) -> float:
    """The factor of a family whose attention rotates the whole head (`reads_partial` false)."""
    covered = int(head_dim * partial)
    if scaling is not None and covered != head_dim:
        # Its default frequencies ignore the factor; the scaled ones (transformers' shared
        # rope functions) read it, and their cos/sin no longer match the head.
        raise ValueError(
            f"partial_rotary_factor={partial}: {model_type}'s attention rotates the whole head, "
            f"but transformers' {scaling['rope_type']!r} frequencies would cover {covered} of its "
            f"{head_dim} channels and the transformers model fails: remove it (transformers "
            "ignores it without scaling)."
        )
    return 1.0
