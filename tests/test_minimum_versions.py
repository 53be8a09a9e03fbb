"""pyproject.toml's `>=` bounds are the pins `.ci/minimum-versions` installs and tests.

The minimums live in `.ci/minimum-constraints.txt`; a bound changed in one file and not in the
other would state a version no run has tested.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

tomllib = pytest.importorskip("tomllib")  # Python >= 3.11

REPOSITORY = Path(__file__).resolve().parents[1]
CONSTRAINTS = REPOSITORY / ".ci" / "minimum-constraints.txt"


def _pins() -> dict[str, str]:
    pins = {}
    for line in CONSTRAINTS.read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        requirement = Requirement(line)
        (specifier,) = requirement.specifier
        assert specifier.operator == "==", line
        pins[canonicalize_name(requirement.name)] = specifier.version
    return pins


def _lower_bounds() -> dict[str, str]:
    project = tomllib.loads((REPOSITORY / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    requirements = list(project["dependencies"])
    for extra in project["optional-dependencies"].values():
        requirements += extra
    bounds = {}
    for text in requirements:
        requirement = Requirement(text)
        name = canonicalize_name(requirement.name)
        if name == canonicalize_name(project["name"]):
            continue  # the extras naming other extras
        for specifier in requirement.specifier:
            if specifier.operator == ">=":
                assert bounds.get(name, specifier.version) == specifier.version, text
                bounds[name] = specifier.version
    return bounds


def test_every_lower_bound_is_a_tested_pin_and_every_pin_a_lower_bound():
    assert _lower_bounds() == _pins()


def test_every_core_dependency_has_a_lower_bound():
    project = tomllib.loads((REPOSITORY / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    unbounded = [
        text
        for text in project["dependencies"]
        if not any(s.operator in (">=", "==") for s in Requirement(text).specifier)
    ]
    assert unbounded == []
