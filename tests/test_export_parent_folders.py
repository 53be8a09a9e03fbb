"""Writers create the missing folders above what they write (`out/...` in every snippet),
and a write that fails leaves none of the folders it created behind."""

from __future__ import annotations

import errno
from pathlib import Path

import keras
import pytest

from keras_posenc import SinusoidalPositionalEncoding
from keras_posenc import export as kpe


@pytest.fixture(scope="module")
def tiny_model():
    inputs = keras.Input((None, 4), name="embeddings")
    return keras.Model(inputs, SinusoidalPositionalEncoding()(inputs))


@pytest.mark.parametrize("kind", ["file", "folder"])
def test_missing_parents_are_created(tmp_path, kind):
    target = tmp_path / "out" / "deep" / "artifact"
    with kpe.whole_or_nothing(target, kind=kind) as written:
        if kind == "file":
            written.write_text("x")
        else:
            written.mkdir()
            (written / "data.txt").write_text("x")
    assert target.is_file() if kind == "file" else (target / "data.txt").is_file()
    # Nothing of the writer's own is left beside it: no lock, no staging folder.
    assert [p.name for p in target.parent.iterdir()] == ["artifact"]


def test_a_failed_write_removes_the_folders_it_created_and_only_those(tmp_path):
    (tmp_path / "out").mkdir()
    target = tmp_path / "out" / "new" / "deeper" / "model.onnx"
    with pytest.raises(RuntimeError, match="conversion failed"):
        with kpe.whole_or_nothing(target, kind="file"):
            raise RuntimeError("conversion failed")
    assert [p.name for p in tmp_path.iterdir()] == ["out"]  # the user's folder kept
    assert list((tmp_path / "out").iterdir()) == []


def test_a_created_folder_that_something_else_filled_is_kept(tmp_path):
    target = tmp_path / "out" / "model"
    with pytest.raises(RuntimeError):
        with kpe.whole_or_nothing(target, kind="folder"):
            (tmp_path / "out" / "report.json").write_text("{}")  # as save_decoder's report
            raise RuntimeError("verification failed")
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["report.json"]


def test_a_file_on_the_way_is_still_refused_before_anything_is_created(tmp_path):
    (tmp_path / "a_file").write_text("")
    with pytest.raises(NotADirectoryError, match="is a file") as error:
        with kpe.whole_or_nothing(tmp_path / "a_file" / "sub" / "model.onnx", kind="file"):
            pass
    assert error.value.errno == errno.ENOTDIR
    assert [p.name for p in tmp_path.iterdir()] == ["a_file"]


def test_save_onnx_and_saved_model_into_missing_folders(tiny_model, tmp_path):
    kpe.save_onnx(tiny_model, tmp_path / "out" / "model.onnx")
    kpe.save_saved_model(tiny_model, tmp_path / "out" / "sm" / "saved_model")
    assert (tmp_path / "out" / "model.onnx").is_file()
    assert kpe.is_saved_model(Path(tmp_path / "out" / "sm" / "saved_model"))


def test_write_json_into_missing_folders(tmp_path):
    kpe.write_json({"a": 1}, tmp_path / "reports" / "today" / "report.json")
    assert (tmp_path / "reports" / "today" / "report.json").read_text().strip().startswith("{")
