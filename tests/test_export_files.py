"""Files written whole, and only ours (`keras_posenc.export.files`).

A kill between the two renames of a folder replacement, stale staging folders, folders
with a user's files in them, a file where a folder goes, and writers racing for one path.
The kill is a real SIGKILL of a child process; everything else runs in this one.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import keras
import pytest

from keras_posenc import SinusoidalPositionalEncoding
from keras_posenc import export as kpe

REPOSITORY = Path(__file__).resolve().parents[1]


def _write_folder(target: Path, text: str) -> None:
    with kpe.whole_or_nothing(target) as written:
        written.mkdir()
        (written / "data.txt").write_text(text)
        (written / "sub").mkdir()
        (written / "sub" / "more.txt").write_text(text)


def test_a_folder_lists_the_files_the_package_wrote(tmp_path):
    target = tmp_path / "artifact"
    _write_folder(target, "one")
    manifest = json.loads((target / kpe.files.MANIFEST).read_text())
    assert manifest["files"] == ["data.txt", "sub/more.txt"]
    assert kpe.written_by_package(target)
    _write_folder(target, "two")  # ours: replaced
    assert (target / "sub" / "more.txt").read_text() == "two"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["artifact"]  # no lock, no staging


def test_a_folder_with_a_users_file_is_refused_and_kept(tmp_path):
    target = tmp_path / "artifact"
    _write_folder(target, "one")
    (target / "NOTES.txt").write_text("mine")
    assert not kpe.written_by_package(target)
    with pytest.raises(FileExistsError, match="NOTES.txt"):
        _write_folder(target, "two")
    assert (target / "NOTES.txt").read_text() == "mine"
    assert (target / "data.txt").read_text() == "one"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["artifact"]


def test_a_folder_another_tool_wrote_is_refused(tmp_path):
    target = tmp_path / "saved_model"
    target.mkdir()
    (target / "saved_model.pb").write_bytes(b"not ours")  # looks like a SavedModel
    with pytest.raises(FileExistsError, match="saved_model.pb"):
        _write_folder(target, "two")
    assert (target / "saved_model.pb").read_bytes() == b"not ours"


def _interrupted_state(tmp_path: Path) -> tuple[Path, Path]:
    """What a kill between the two renames leaves: no target, the old one in staging."""
    target = tmp_path / "artifact"
    _write_folder(target, "old")
    staging = tmp_path / ".artifact.abcd_123.tmp"
    staging.mkdir()
    os.replace(target, staging / ".replaced")
    (staging / "artifact").mkdir()  # the new one, complete or not
    return target, staging


def test_the_next_export_restores_what_a_kill_left_aside(tmp_path):
    target, staging = _interrupted_state(tmp_path)
    with pytest.raises(RuntimeError, match="fails"):
        with kpe.whole_or_nothing(target):
            raise RuntimeError("this export fails too")
    assert (target / "data.txt").read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["artifact"]


def test_loading_restores_what_a_kill_left_aside(tmp_path):
    target, staging = _interrupted_state(tmp_path)
    assert kpe.recover_interrupted(target) is True
    assert (target / "data.txt").read_text() == "old"
    assert not staging.exists()


def test_stale_staging_folders_are_removed_and_others_kept(tmp_path):
    target = tmp_path / "model.onnx"
    stale = [tmp_path / ".model.onnx.a1b2c3d4.tmp", tmp_path / ".model.onnx.zz__zz99.tmp"]
    for folder in stale:
        folder.mkdir()
        (folder / "model.onnx").write_text("half")
    # Not ours to remove: another target's staging folder, a user's folder.
    other = tmp_path / ".model.a1b2c3d4.tmp"
    other.mkdir()
    user = tmp_path / ".model.onnx.backup"
    user.mkdir()
    with kpe.whole_or_nothing(target, kind="file") as written:
        written.write_text("whole")
    assert target.read_text() == "whole"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [".model.a1b2c3d4.tmp", ".model.onnx.backup", "model.onnx"]
    )


_KILLED_BETWEEN_RENAMES = textwrap.dedent(
    """
    import os, signal, sys
    from pathlib import Path
    from keras_posenc.export import files

    target = Path(sys.argv[1])
    renames = []
    real_replace = os.replace

    def replace(source, destination):
        renames.append((source, destination))
        if len(renames) == 2:  # the old folder is aside, the new one not yet in
            os.kill(os.getpid(), signal.SIGKILL)
        real_replace(source, destination)

    files.os.replace = replace
    with files.whole_or_nothing(target) as written:
        written.mkdir()
        (written / "data.txt").write_text("new")
    """
)


def test_a_real_kill_between_the_renames_is_recovered(tmp_path):
    target = tmp_path / "artifact"
    _write_folder(target, "old")
    result = subprocess.run(
        [sys.executable, "-c", _KILLED_BETWEEN_RENAMES, str(target)],
        cwd=REPOSITORY,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": str(REPOSITORY)},
    )
    assert result.returncode == -signal.SIGKILL, result.stderr[-2000:]
    assert not target.exists()  # what the kill left: the old folder aside, hidden
    (aside,) = [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    assert (aside / ".replaced" / "data.txt").read_text() == "old"

    _write_folder(target, "next")  # the next export finds it, and then replaces it
    assert (target / "data.txt").read_text() == "next"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["artifact"]


def test_an_interrupt_between_the_renames_puts_the_old_folder_back(tmp_path, monkeypatch):
    target = tmp_path / "artifact"
    _write_folder(target, "old")
    real_replace = os.replace
    calls = []

    def replace(source, destination):
        calls.append(source)
        if len(calls) == 2:
            raise KeyboardInterrupt
        real_replace(source, destination)

    monkeypatch.setattr(kpe.files.os, "replace", replace)
    with pytest.raises(KeyboardInterrupt):
        _write_folder(target, "new")
    monkeypatch.setattr(kpe.files.os, "replace", real_replace)
    assert (target / "data.txt").read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["artifact"]


def test_concurrent_writers_one_wins_whole_the_others_get_a_clear_error(tmp_path):
    target = tmp_path / "report.json"
    inside = threading.Event()
    release = threading.Event()
    errors = []

    def first():
        with kpe.whole_or_nothing(target, kind="file") as written:
            written.write_text("first")
            inside.set()
            release.wait(30)

    def second():
        try:
            kpe.write_json({"second": True}, target)
        except kpe.ExportError as error:
            errors.append(error)

    winner = threading.Thread(target=first)
    winner.start()
    assert inside.wait(30)
    losers = [threading.Thread(target=second) for _ in range(3)]
    for thread in losers:
        thread.start()
    for thread in losers:
        thread.join(30)
    release.set()
    winner.join(30)
    assert len(errors) == 3
    assert all("Another export is writing" in str(e) for e in errors)
    assert target.read_text() == "first"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.json"]
    kpe.write_json({"later": True}, target)  # the lock is gone with its holder
    assert json.loads(target.read_text()) == {"later": True}


@pytest.fixture(scope="module")
def tiny_model():
    inputs = keras.Input((None, 4), name="embeddings")
    return keras.Model(inputs, SinusoidalPositionalEncoding()(inputs))


def test_save_saved_model_onto_a_file_fails_before_converting(tiny_model, tmp_path, monkeypatch):
    target = tmp_path / "saved_model"
    target.write_text("a file")

    def must_not_run(*args, **kwargs):
        raise AssertionError("converted although the target is a file")

    monkeypatch.setattr(kpe.saved_model.keras.export, "ExportArchive", must_not_run)
    with pytest.raises(FileExistsError, match="is a file"):
        kpe.save_saved_model(tiny_model, target)
    assert target.read_text() == "a file"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["saved_model"]


def test_save_onto_a_folder_with_a_users_file_is_refused(tiny_model, tmp_path):
    target = tmp_path / "saved_model"
    kpe.save_saved_model(tiny_model, target)
    (target / "NOTES.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="NOTES.txt"):
        kpe.save_saved_model(tiny_model, target)
    assert (target / "NOTES.txt").read_text() == "mine"
    assert kpe.is_saved_model(target)


def _record_syncs_and_renames(monkeypatch) -> list[tuple]:
    """`("fsync", inode)` and `("replace", destination)` events, in the order they happen."""
    events = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(descriptor):
        events.append(("fsync", os.fstat(descriptor).st_ino))
        real_fsync(descriptor)

    def replace(source, destination):
        real_replace(source, destination)
        events.append(("replace", Path(destination)))

    monkeypatch.setattr(kpe.files.os, "fsync", fsync)
    monkeypatch.setattr(kpe.files.os, "replace", replace)
    return events


def _inode(path: Path) -> int:
    return os.stat(path).st_ino


@pytest.mark.skipif(os.name != "posix", reason="folders are synced where the OS allows it")
def test_a_file_is_synced_before_its_rename_and_the_folder_after(tmp_path, monkeypatch):
    events = _record_syncs_and_renames(monkeypatch)
    target = kpe.write_json({"a": 1}, tmp_path / "report.json")
    rename = events.index(("replace", target))
    assert ("fsync", _inode(target)) in events[:rename]  # the content, before it is visible
    assert ("fsync", _inode(tmp_path)) in events[rename + 1 :]  # the rename itself


@pytest.mark.skipif(os.name != "posix", reason="folders are synced where the OS allows it")
def test_every_file_and_folder_of_a_folder_is_synced_before_its_rename(tmp_path, monkeypatch):
    target = tmp_path / "artifact"
    _write_folder(target, "old")
    events = _record_syncs_and_renames(monkeypatch)
    _write_folder(target, "new")  # a replacement: two renames
    last_rename = max(i for i, event in enumerate(events) if event == ("replace", target))
    before = set(events[:last_rename])
    for path in (
        target / "data.txt",
        target / "sub" / "more.txt",
        target / kpe.files.MANIFEST,
        target / "sub",
        target,
    ):
        assert ("fsync", _inode(path)) in before, path
    assert ("fsync", _inode(tmp_path)) in events[last_rename + 1 :]


@pytest.mark.parametrize("name", ["", ".", "..", "/", "out/.."])
def test_a_path_that_names_no_file_or_folder_is_refused_before_anything_is_written(
    tmp_path, monkeypatch, name
):
    # "" and "." are the current folder, "/" the root: writing an export "there" would
    # mean replacing the folder the user is in.
    monkeypatch.chdir(tmp_path)
    (tmp_path / "out").mkdir()
    with pytest.raises(ValueError, match="names no file or folder"):
        with kpe.whole_or_nothing(name):
            raise AssertionError("never reached")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no lock, no staging
    assert list((tmp_path / "out").iterdir()) == []


def test_a_foreign_folder_is_refused_by_its_top_level_entries_without_walking_it(tmp_path):
    # A folder with no manifest is not ours whatever it holds: naming its first entries
    # is enough, and walking a large tree (a home folder) would take minutes.
    target = tmp_path / "home"
    (target / "deep" / "er").mkdir(parents=True)
    (target / "deep" / "er" / "file.txt").write_text("mine")
    (target / "top.txt").write_text("mine")
    with pytest.raises(FileExistsError, match=r"\(deep/, top.txt\)"):
        with kpe.whole_or_nothing(target):
            raise AssertionError("never reached")
    assert (target / "deep" / "er" / "file.txt").read_text() == "mine"


@pytest.mark.parametrize(
    "save, name", [(kpe.save_onnx, "model.tflite"), (kpe.save_litert, "model.ONNX")]
)
def test_a_file_named_for_the_other_format_is_refused_before_conversion(tmp_path, save, name):
    inputs = keras.Input((None, 8))
    model = keras.Model(inputs, SinusoidalPositionalEncoding()(inputs))
    with pytest.raises(ValueError, match="names a .* file, but this writes a"):
        save(model, tmp_path / name)
    assert list(tmp_path.iterdir()) == []
