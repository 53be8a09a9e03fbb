"""The Python blocks of docs/*.md run as written: each page's blocks in order, in one
namespace, in an empty folder (they write `out/...`).

A block that cannot run here (a download, a JAX cluster, a measurement of minutes) starts
with `# not run in tests: <what it needs>`; it is still compiled, so it stays valid Python.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[1] / "docs"
NOT_RUN = "# not run in tests: "
# Installed by the `test` extra but not by `test-core` (the minimum versions' run).
OPTIONAL = {"onnxruntime_genai", "litert_lm", "litert_lm_builder", "jax", "torch", "transformers"}


def _blocks(page: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", page.read_text(encoding="utf-8"), flags=re.S)


PAGES = sorted(page for page in DOCS.glob("*.md") if _blocks(page))


def test_pages_with_python_blocks_are_found():
    assert {"decoding.md", "keras_hub.md"} <= {page.name for page in PAGES}


@pytest.mark.parametrize("page", PAGES, ids=[page.name for page in PAGES])
def test_every_block_compiles_and_says_why_when_it_is_not_run(page):
    for block in _blocks(page):
        compile(block, str(page), "exec")
        first = block.splitlines()[0]
        if first.startswith("# not run"):
            assert first.startswith(NOT_RUN) and len(first) > len(NOT_RUN) + 10, first


# The pages with a block meant to run (the others' blocks each say why not, checked above).
RUNNABLE = [page for page in PAGES if any(not b.startswith(NOT_RUN) for b in _blocks(page))]


@pytest.mark.parametrize("page", RUNNABLE, ids=[page.name for page in RUNNABLE])
def test_the_blocks_meant_to_run_run(page, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(DOCS.parent / "tests"))
    runnable = [b for b in _blocks(page) if not b.startswith(NOT_RUN)]
    for block in runnable:  # the `test` extra's runtimes, absent from `test-core`
        for module in OPTIONAL & set(re.findall(r"^(?:import|from) (\w+)", block, flags=re.M)):
            pytest.importorskip(module, reason=f"{page.name} runs {module}, not installed")
    namespace: dict = {"__name__": "__docs__"}
    for block in runnable:
        exec(compile(block, str(page), "exec"), namespace)  # noqa: S102
