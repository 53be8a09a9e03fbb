"""The query / key norms of a transformers config's attention, as transformers 5.24 applies them.

`query_key_norm_arguments` gives the `query_key_norm` / `query_key_norm_epsilon` arguments of
a rotary attention layer for one layer of a config, read from each family's attention module
(its norm's form, the config key of its epsilon and that key's default in the config class).
A family whose norm these layers do not compute is refused, naming the family and the
setting: attention built without it would give other outputs, silently.
"""

from __future__ import annotations

from keras_posenc._checks import short_repr
from keras_posenc.configs.family import Family, Norm


def _epsilon(config: dict, norm: Norm) -> float:
    value = config.get(norm.epsilon_key, norm.epsilon)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(
            f"config[{norm.epsilon_key!r}] must be a positive number (the q/k norms' "
            f"epsilon), got {short_repr(value)}."
        )
    return float(value)


def query_key_norm_arguments(config: dict, model_type: str, family: Family, nope: bool) -> dict:
    """`{"query_key_norm", "query_key_norm_epsilon"}` of one layer, or `{}` without q/k norm.

    Args:
        config: the language model's config dict.
        model_type: its `model_type`, and `family` its record in
            `keras_posenc.configs.families.FAMILIES` (its `norm` and `refused_norm`).
        nope: whether the layer uses no RoPE.

    Raises:
        ValueError: the family's q/k norm is one these layers do not compute.
    """
    if family.refused_norm is not None:
        key, why = family.refused_norm
        if key is None or config.get(key):
            setting = "" if key is None else f" ({key}={short_repr(config[key])})"
            fix = "" if key is None else f"; a config with {key}=false reads"
            raise ValueError(
                f"This {model_type} config normalizes its queries and keys{setting}: {why}, "
                f"so the attention would give other outputs{fix}."
            )
        return {}
    norm = family.norm
    if norm is None or (norm.rope_layers_only and nope):
        return {}
    if norm.flag is not None and not config.get(*norm.flag):
        return {}
    return {"query_key_norm": norm.kind, "query_key_norm_epsilon": _epsilon(config, norm)}
