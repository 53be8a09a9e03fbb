"""The README's Python examples run as written (in an empty folder: they write `out/...`)."""

import pathlib
import re

import numpy as np
import pytest

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.S)


def _run(block: str) -> dict:
    namespace: dict = {}
    exec(compile(block, str(README), "exec"), namespace)  # noqa: S102
    return namespace


@pytest.fixture(autouse=True)
def _in_an_empty_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)


def test_readme_has_python_examples_and_they_run():
    blocks = python_blocks()
    assert blocks, "the README lost its Python examples"
    for block in blocks:
        if "og.Generator" not in block:  # run (and its tokens compared) below
            _run(block)


def test_readme_quick_start_results_have_the_documented_shapes():
    namespace = _run(python_blocks()[0])
    assert tuple(namespace["y"].shape) == (1, 4, 64)
    assert tuple(namespace["rotated"].shape) == (1, 4, 4, 16)
    assert tuple(namespace["out"].shape) == (1, 4, 64)


def test_readme_decoder_gives_keras_hubs_tokens_in_onnxruntime_genai(tmp_path):
    pytest.importorskip("onnxruntime_genai")  # in the test extra, not in minimum-versions'
    (block,) = [b for b in python_blocks() if "og.Generator" in b]
    namespace = _run(block)
    genai = np.asarray(namespace["generator"].get_sequence(0))
    reference = np.asarray(namespace["reference"]["token_ids"][0])
    assert genai.shape == reference.shape == (20,)
    np.testing.assert_array_equal(genai, reference)
    assert (tmp_path / "out" / "llama" / "genai_config.json").is_file()
