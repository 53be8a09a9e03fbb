"""The commands a newcomer runs: answered fast, from any folder, and writing tracked docs/
files only when asked."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPOSITORY = Path(__file__).resolve().parents[1]
HEAVY = {"tensorflow", "keras", "keras_posenc", "keras_hub", "jax", "torch"}


def _python(code_or_args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    environment = {**os.environ, "PYTHONPATH": str(REPOSITORY)}
    return subprocess.run(
        [sys.executable, *code_or_args],
        cwd=cwd,
        env=environment,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_benchmarks_help_loads_neither_keras_nor_tensorflow(tmp_path):
    probe = (
        "import sys\n"
        "from benchmarks.__main__ import parse_args\n"
        "try:\n"
        "    parse_args(['--help'])\n"
        "except SystemExit as exit_:\n"
        "    print('status', exit_.code)\n"
        f"print('loaded', sorted(set({sorted(HEAVY)!r}) & set(sys.modules)))\n"
    )
    result = _python(["-c", probe], REPOSITORY)
    assert "status 0" in result.stdout, result.stdout + result.stderr
    assert "loaded []" in result.stdout, result.stdout
    assert "--write-docs" in result.stdout


def test_the_export_job_runs_from_any_folder(tmp_path):
    result = _python(["-m", "keras_posenc_cli", "--help"], tmp_path)
    assert result.returncode == 0, result.stderr
    assert "usage: python -m keras_posenc_cli" in result.stdout


@pytest.fixture
def precision(monkeypatch):
    """`benchmarks.precision` with a one-row table and its writes recorded, not made."""
    from benchmarks import precision

    written = []
    monkeypatch.setattr(precision, "table", lambda hub: ["| a row |"])
    monkeypatch.setattr(precision, "write_whole", lambda path, text: written.append(Path(path)))
    return precision, written


def test_precision_prints_and_writes_no_tracked_page_by_default(precision, capsys):
    module, written = precision
    module.main(["--without-keras-hub"])
    assert written == []
    assert "| a row |" in capsys.readouterr().out


def test_precision_writes_the_page_when_asked(precision, tmp_path):
    module, written = precision
    module.main(["--without-keras-hub", "--write-docs", "--out", str(tmp_path / "p.md")])
    assert written == [tmp_path / "p.md", REPOSITORY / "docs" / "precision.md"]
