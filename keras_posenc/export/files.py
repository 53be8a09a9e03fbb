"""Writing files whole or not at all."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

from keras_posenc.export.errors import ExportError


@contextlib.contextmanager
def whole_or_nothing(
    target: str | os.PathLike, replace_if: Callable[[Path], bool] | None = None
) -> Iterator[Path]:
    """Yields a path to write in place of `target`; renamed to `target` only on success.

    The path lies in a fresh temporary folder next to `target` (the same file system, so
    the rename is atomic for a file); that folder is removed afterwards whatever happens.
    An existing file at `target` is replaced; an existing folder only when it is empty
    or `replace_if(folder)` holds (it is moved aside, the new one renamed in, the old one
    removed).

    Example:

    ```python
    with whole_or_nothing("out/report.json") as path:
        path.write_text("{}")  # out/report.json appears only when this block succeeds
    ```

    Args:
        target: the file or folder to write.
        replace_if: which existing folders may be replaced.
    """
    target = Path(target)
    parent = target.parent
    if parent.exists() and not parent.is_dir():
        raise NotADirectoryError(
            errno.ENOTDIR,
            f"{str(parent)!r} is a file, not a folder to write {target.name!r} into",
            str(parent),
        )
    if not parent.is_dir():
        raise FileNotFoundError(
            errno.ENOENT,
            f"The folder {str(parent)!r} to write {target.name!r} into does not exist; "
            "create it first",
            str(parent),
        )
    if target.is_dir() and any(target.iterdir()):
        if replace_if is None or not replace_if(target):
            raise FileExistsError(
                errno.EEXIST,
                f"{str(target)!r} is a folder with other contents than this export would "
                "write; remove it or choose another path",
                str(target),
            )
    try:
        staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=parent))
    except OSError as error:
        raise OSError(
            error.errno,
            f"Cannot write into {str(parent)!r} ({error.strerror}); choose a folder you can "
            "write to",
            str(parent),
        ) from error
    try:
        written = staging / target.name
        yield written
        if not written.exists():
            raise ExportError(f"Nothing was written for {str(target)!r}.")
        if target.is_dir():
            aside = staging / ".replaced"
            os.replace(target, aside)
            try:
                os.replace(written, target)
            except OSError:
                os.replace(aside, target)
                raise
        else:
            os.replace(written, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def is_saved_model(folder: Path) -> bool:
    """Whether `folder` holds a SavedModel."""
    return (Path(folder) / "saved_model.pb").is_file()


def write_json(data: dict, path: str | os.PathLike) -> Path:
    """Writes `data` as indented JSON to `path`, whole or not at all."""
    with whole_or_nothing(path) as written:
        written.write_text(json.dumps(data, indent=2) + "\n")
    return Path(path)
