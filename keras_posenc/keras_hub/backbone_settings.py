"""A keras_hub backbone's settings the bridge was not written for, refused by name.

The block readers (`families/`) read every setting of the keras_hub 0.32 backbones of
the registered families from the layers (and refuse the ones the export cannot write,
by name); each family lists the config keys its readers read (`HubFamily.read_keys`). A
backbone whose config holds another key (a later keras_hub's new option, a subclass's
own) set to something other than its constructor's default would be read without it:
refused, naming the key and value, before any work.
"""

from __future__ import annotations

from keras_posenc.export.decoder.settings import unread_settings
from keras_posenc.export.errors import ExportError
from keras_posenc.keras_hub import families

# The keys every backbone has, read by `backbone_reader.py`.
_EVERY_BACKBONE = {
    "vocabulary_size",
    "num_layers",
    "hidden_dim",
    "intermediate_dim",
    "num_key_value_heads",
    "layer_norm_epsilon",
}


def refuse_unread_backbone_settings(backbone, owner: str) -> None:
    """Raises an ExportError naming each setting of `backbone`'s config that is not
    one the bridge reads and differs from the constructor's default.

    Raises:
        ExportError: such a setting.
    """
    known = families.read_keys(backbone)
    if known is None:  # not a backbone of a family: its CausalLM was refused already
        return
    unread = unread_settings(backbone, known | _EVERY_BACKBONE)
    if unread:
        settings = ", ".join(f"{key}={value!r}" for key, value in unread.items())
        raise ExportError(
            f"{owner} has settings save_decoder does not read: {settings}. The file would "
            "compute without them; export a model without them (or at their defaults)."
        )
