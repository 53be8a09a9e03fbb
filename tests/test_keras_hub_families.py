"""The keras_hub bridge's family registry against keras_hub itself, and its privates in one file.

Every registered `HubFamily` names classes keras_hub has (its CausalLM, aliases of that
same class, its backbone, the rotary layers it reads), and config keys its backbone's
constructor takes (or another family's): a misspelt name would leave a family
unreachable or a setting refused, which no tiny model of another family shows. And no
module of the bridge but `private.py` reads a keras_hub object's private attribute.
"""

from __future__ import annotations

import ast
import importlib
import inspect
from pathlib import Path

import keras_hub
import pytest

import keras_posenc.keras_hub
from keras_posenc.keras_hub import ALIASES, FAMILIES, families

FOLDER = Path(keras_posenc.keras_hub.__file__).parent
NAMES = [family.causal_lm for family in families.REGISTERED]


@pytest.mark.parametrize("name", NAMES)
def test_a_family_names_keras_hub_classes_and_keys(name):
    family = families.family_named(name)
    causal_lm = getattr(keras_hub.models, family.causal_lm)
    assert causal_lm.__module__.startswith("keras_hub.")
    for alias in family.aliases:
        assert getattr(keras_hub.models, alias) is causal_lm
    backbone = getattr(keras_hub.models, family.backbone)
    assert causal_lm.backbone_cls is backbone
    # Gemma 4's keys extend Gemma 3's, some of which its constructor lacks: a key is
    # taken by this backbone or by another family's (a typo by none).
    taken = set(inspect.signature(backbone.__init__).parameters)
    assert family.read_keys & taken
    every = set().union(*(_parameters(f.backbone) for f in families.REGISTERED))
    assert family.read_keys <= every, sorted(family.read_keys - every)


def _parameters(backbone: str) -> set[str]:
    return set(inspect.signature(getattr(keras_hub.models, backbone).__init__).parameters)


def test_the_registry_is_what_the_public_names_say():
    assert list(FAMILIES) == NAMES
    assert len(set(NAMES)) == len(NAMES)
    assert ALIASES == {"Qwen2CausalLM": "QwenCausalLM"}
    backbones = [family.backbone for family in families.REGISTERED]
    assert len(set(backbones)) == len(backbones)
    for family in families.REGISTERED:
        assert FAMILIES[family.causal_lm] is family.read_block or (
            FAMILIES[family.causal_lm] == family.read_block  # a bound method, made anew
        )


# Where keras_hub 0.32 defines the rotary layers the families name.
ROTARY_MODULES = [
    "keras_hub.src.models.llama.llama_rotary_embedding",
    "keras_hub.src.models.phi3.phi3_rotary_embedding",
    "keras_hub.src.models.smollm3.smollm3_layers",
]


def test_the_rotary_classes_read_are_keras_hub_layers():
    own = {"ProportionalRotary"}  # Gemma 4's wrapper of keras_hub's RotaryEmbedding
    kinds = {kind for family in families.REGISTERED for kind in family.rotaries} - own
    modules = [importlib.import_module(name) for name in ROTARY_MODULES]
    assert kinds == {kind for kind in kinds if any(hasattr(m, kind) for m in modules)}
    assert len(kinds) == 3


def _private_reads(path: Path) -> list[str]:
    """`x._name` (x not self) and `getattr(x, "_name" or f"_...")` in the module at `path`."""
    reads = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_"):
            owner = node.value
            if not node.attr.startswith("__") and not (
                isinstance(owner, ast.Name) and owner.id in ("self", "_keras_private")
            ):
                reads.append(f"{path.name}:{node.lineno} .{node.attr}")
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "getattr":
            name = node.args[1]
            text = name.values[0] if isinstance(name, ast.JoinedStr) and name.values else name
            if isinstance(text, ast.Constant) and str(text.value).startswith("_"):
                reads.append(f"{path.name}:{node.lineno} getattr {text.value!r}")
    return reads


def test_only_private_py_reads_keras_hub_privates():
    modules = sorted(FOLDER.rglob("*.py"))
    assert FOLDER / "private.py" in modules
    assert _private_reads(FOLDER / "private.py")  # the scan sees what private.py reads
    reads = [read for path in modules if path.name != "private.py" for read in _private_reads(path)]
    assert reads == []
