"""Who imports whom among the top-level packages: the command line imports the library,
never the reverse, and what runs before Keras loads imports neither (issue #38)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPOSITORY = Path(__file__).resolve().parents[1]


def _imported(package: str) -> dict[str, set[str]]:
    """The top-level names each module of `package` imports, by module path."""
    found = {}
    for path in sorted((REPOSITORY / package).rglob("*.py")):
        names = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names.add(node.module.split(".")[0])
        found[str(path.relative_to(REPOSITORY))] = names
    return found


@pytest.mark.parametrize(
    "package, forbidden",
    [
        ("keras_posenc", {"keras_posenc_cli", "export"}),
        ("keras_posenc_startup", {"keras", "tensorflow", "keras_posenc", "keras_posenc_cli"}),
    ],
)
def test_a_package_imports_none_of_those_above_it(package, forbidden):
    offenders = {
        module: sorted(names & forbidden)
        for module, names in _imported(package).items()
        if names & forbidden
    }
    assert not offenders


def test_the_command_line_package_imports_no_keras_when_imported():
    # Its package imports only the standard library and keras_posenc_startup at import.
    names = _imported("keras_posenc_cli")["keras_posenc_cli/__init__.py"]
    assert "keras" not in names and "tensorflow" not in names
    assert "keras_posenc_startup" in names
