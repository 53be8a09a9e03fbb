"""Writing files whole or not at all, and replacing only what the package wrote.

The guarantees, for every artifact the package writes (`whole_or_nothing`):

- **Whole or not at all.** The artifact is written in a staging folder `.NAME.XXXXXXXX.tmp`
  next to it and renamed into place only when complete. A file is replaced by one atomic
  rename. A folder takes two (the old one aside into the staging folder, the new one in):
  a process killed between them leaves the old folder in `.NAME.XXXXXXXX.tmp/.replaced`,
  and the next export to, or verification of, that path puts it back (`recover`).
- **Durable once renamed.** Every file written is synced to disk (`fsync`) before the
  rename that makes it visible, and so is every folder written (its entries); the folder
  holding the artifact is synced after the last rename, so that the rename itself survives
  a power loss, not only a killed process. Folders are synced where the platform allows it
  (POSIX; not Windows).
- **Stale staging folders are cleaned.** A killed export leaves its staging folder; the
  next export to the same path removes it (after restoring what it held, as above).
- **Only ours.** Every folder the package writes lists its files in a hidden manifest
  (`.keras-posenc-files`). An existing folder is replaced only when it is empty or holds
  nothing but the files its manifest lists; a folder with anything else in it (a user's
  `NOTES.txt`, or a folder another tool wrote) is refused, never deleted.
- **One writer at a time.** A writer holds an exclusive lock (`.NAME.lock`, removed when it
  is done) from its first check to its last rename; a second writer of the same path fails
  at once with an `ExportError` that says so. Where the platform has no `fcntl` (Windows),
  this lock is not taken.

One module per guarantee that stands on its own: `sync` (durable), `manifest` (only ours),
`lock` (one writer); staging, the renames and `recover` are here.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

from keras_posenc.export.errors import ExportError
from keras_posenc.export.files.lock import exclusive, not_writable
from keras_posenc.export.files.manifest import (
    MANIFEST,
    foreign_files,
    write_manifest,
    written_by_package,
)
from keras_posenc.export.files.sync import sync_folder, sync_tree

__all__ = [
    "MANIFEST",
    "check_file_target",
    "is_saved_model",
    "recover",
    "recover_interrupted",
    "whole_or_nothing",
    "write_json",
    "written_by_package",
]

_REPLACED = ".replaced"
_KINDS = (None, "file", "folder")


def _staging_pattern(name: str) -> re.Pattern:
    # mkdtemp's random part: 8 characters of [a-z0-9_]. Exact, so that the staging folders
    # of `model` never match those of `model.onnx`.
    return re.compile(rf"\.{re.escape(name)}\.[A-Za-z0-9_]{{8}}\.tmp")


def recover(target: str | os.PathLike) -> bool:
    """Finishes what a killed `whole_or_nothing` left next to `target`.

    When `target` is absent and a staging folder holds the folder it replaced, that folder
    is put back (the old artifact, whole); every staging folder of `target` is then removed.
    Call it only while no other process writes `target` (`whole_or_nothing` holds its lock).

    Args:
        target: the artifact's path.

    Returns:
        Whether an old artifact was put back.
    """
    target = Path(target)
    parent = target.parent
    if not parent.is_dir():
        return False
    pattern = _staging_pattern(target.name)
    restored = False
    for staging in sorted(parent.iterdir()):
        if not pattern.fullmatch(staging.name) or not staging.is_dir():
            continue
        aside = staging / _REPLACED
        if aside.exists() and not os.path.lexists(target):
            os.replace(aside, target)
            restored = True
        shutil.rmtree(staging, ignore_errors=True)
    if restored:
        sync_folder(parent)
    return restored


def recover_interrupted(target: str | os.PathLike) -> bool:
    """`recover(target)` unless another process is writing `target` now (then nothing).

    What loading an artifact calls first (`verify_export` does): an artifact a killed
    export left aside is back in place before it is read.
    """
    target = Path(target)
    if not target.parent.is_dir():
        return False
    try:
        with exclusive(target):
            return recover(target)
    except (ExportError, OSError):  # being written, or a folder we cannot write to
        return False


# What each file an export writes is, by the suffix its name should carry.
_FILE_SUFFIXES = {".onnx": "ONNX", ".tflite": "LiteRT"}


def check_file_target(path: str | os.PathLike, suffix: str) -> None:
    """Refuses, before any work, a file `path` that is a folder or names the other format.

    A LiteRT file named `model.onnx` (or the reverse) would be opened by the wrong runtime
    by anyone who trusts the name; any other name is the user's choice.
    """
    if Path(path).is_dir():
        raise IsADirectoryError(
            errno.EISDIR, f"{str(path)!r} is a folder; give the path of a {suffix} file", str(path)
        )
    other = Path(path).suffix.lower()
    if other in _FILE_SUFFIXES and other != suffix:
        raise ValueError(
            f"{str(path)!r} names a {_FILE_SUFFIXES[other]} file, but this writes a "
            f"{_FILE_SUFFIXES[suffix]} file: name it {str(Path(path).with_suffix(suffix))!r}."
        )


def _make_parent(target: Path) -> list[Path]:
    """Creates the missing folders above `target`; returns them, the outermost first.

    A file on the way is refused before anything is created.
    """
    missing = []
    parent = target.parent
    while not parent.exists() and parent != parent.parent:
        missing.append(parent)
        parent = parent.parent
    if not parent.is_dir():
        raise NotADirectoryError(
            errno.ENOTDIR,
            f"{str(parent)!r} is a file, not a folder to write {target.name!r} into",
            str(parent),
        )
    missing.reverse()
    try:
        for folder in missing:
            folder.mkdir()
    except FileExistsError:  # another writer created it meanwhile: theirs to keep
        pass
    except OSError as error:
        _remove_empty(missing)
        raise OSError(
            error.errno,
            f"Cannot create the folder {str(target.parent)!r} ({error.strerror}); choose a "
            "folder you can write to",
            str(target.parent),
        ) from error
    return missing


def _remove_empty(created: list[Path]) -> None:
    """Removes the folders `_make_parent` created, the innermost first, while still empty
    (a failure report written into one keeps it and those above it)."""
    for folder in reversed(created):
        try:
            folder.rmdir()
        except OSError:
            return


def _check_replaceable(target: Path, kind, replace_if) -> None:
    if kind == "folder" and target.exists() and not target.is_dir():
        raise FileExistsError(
            errno.EEXIST,
            f"{str(target)!r} is a file, and this export writes a folder there; remove the "
            "file or choose another path",
            str(target),
        )
    if kind == "file" and target.is_dir():
        raise IsADirectoryError(
            errno.EISDIR,
            f"{str(target)!r} is a folder, and this export writes a file there; give the "
            "path of a file",
            str(target),
        )
    if target.is_dir() and any(target.iterdir()):
        if not written_by_package(target) or (replace_if is not None and not replace_if(target)):
            foreign = foreign_files(target)
            shown = ", ".join(foreign[:3]) + (", ..." if len(foreign) > 3 else "")
            raise FileExistsError(
                errno.EEXIST,
                f"{str(target)!r} is a folder with other contents than this export would "
                f"write ({shown or 'not written by keras_posenc'}); it is left as it is: "
                "remove it yourself or choose another path",
                str(target),
            )


@contextlib.contextmanager
def whole_or_nothing(
    target: str | os.PathLike,
    replace_if: Callable[[Path], bool] | None = None,
    *,
    kind: str | None = None,
) -> Iterator[Path]:
    """Yields a path to write in place of `target`; renamed to `target` only on success.

    The path lies in a fresh staging folder next to `target` (the same file system, so the
    rename is atomic for a file); that folder is removed afterwards whatever happens. An
    existing file at `target` is replaced; an existing folder only when it is empty, or
    holds only the files the package wrote there and `replace_if(folder)` holds (when
    given). A folder written here gets a manifest of its files. See the module docstring
    for what happens when a process is killed, and for concurrent writers. Missing folders
    above `target` are created; a write that fails removes those of them still empty.

    Example:

    ```python
    with whole_or_nothing("out/report.json") as path:
        path.write_text("{}")  # out/report.json appears only when this block succeeds
    ```

    Args:
        target: the file or folder to write.
        replace_if: which existing folders (written by the package) may be replaced.
        kind: `"file"` or `"folder"` when the caller knows what it writes: the other kind
            already at `target` is an error at once, before anything is written.

    Raises:
        ValueError: `target` names no file or folder (`""`, `"."`, `"/"`, `".."`).
        NotADirectoryError: a file lies on the way to `target`.
        ExportError: another process is writing `target`.
        FileExistsError: `target` is a folder that may not be replaced (or a file, for
            `kind="folder"`).
    """
    if kind not in _KINDS:
        raise ValueError(f"kind must be one of {_KINDS}, got {kind!r}.")
    target = Path(target)
    if target.name in ("", ".."):  # "", ".", "/", "..": the folder the user is in, or above
        raise ValueError(
            f"{str(target)!r} names no file or folder to write: give a path such as "
            "'out/model.onnx' or 'out/model'."
        )
    created = _make_parent(target)
    try:
        with exclusive(target):
            yield from _write_in_staging(target, replace_if, kind)
    except BaseException:
        _remove_empty(created)
        raise


def _write_in_staging(target: Path, replace_if, kind) -> Iterator[Path]:
    """`whole_or_nothing`'s work under the lock: one `yield` of the path to write."""
    recover(target)
    _check_replaceable(target, kind, replace_if)
    try:
        staging = Path(
            tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
        )
    except OSError as error:
        raise not_writable(error, target.parent) from error
    try:
        written = staging / target.name
        yield written
        if not os.path.lexists(written):
            raise ExportError(f"Nothing was written for {str(target)!r}.")
        if written.is_dir():
            write_manifest(written)
        sync_tree(written)  # the content on disk before the rename makes it visible
        if target.is_dir():
            aside = staging / _REPLACED
            os.replace(target, aside)
            try:
                os.replace(written, target)
            except OSError:
                os.replace(aside, target)
                raise
        else:
            os.replace(written, target)
        sync_folder(target.parent)  # the rename itself
    finally:
        # Interrupted between the two renames (KeyboardInterrupt): the old one goes back.
        aside = staging / _REPLACED
        if aside.exists() and not os.path.lexists(target):
            os.replace(aside, target)
        shutil.rmtree(staging, ignore_errors=True)


def is_saved_model(folder: Path) -> bool:
    """Whether `folder` holds a SavedModel."""
    return (Path(folder) / "saved_model.pb").is_file()


def write_json(data: dict, path: str | os.PathLike) -> Path:
    """Writes `data` as indented JSON to `path`, whole or not at all."""
    with whole_or_nothing(path, kind="file") as written:
        written.write_text(json.dumps(data, indent=2) + "\n")
    return Path(path)
