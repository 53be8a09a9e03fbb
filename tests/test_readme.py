"""The README's Python examples run as written."""

import pathlib
import re

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.S)


def test_readme_has_python_examples_and_they_run():
    blocks = python_blocks()
    assert blocks, "the README lost its Python examples"
    for block in blocks:
        namespace: dict = {}
        exec(compile(block, str(README), "exec"), namespace)  # noqa: S102


def test_readme_quick_start_results_have_the_documented_shapes():
    namespace: dict = {}
    exec(compile(python_blocks()[0], str(README), "exec"), namespace)  # noqa: S102
    assert tuple(namespace["y"].shape) == (1, 4, 64)
    assert tuple(namespace["rotated"].shape) == (1, 4, 4, 16)
    assert tuple(namespace["out"].shape) == (1, 4, 64)
