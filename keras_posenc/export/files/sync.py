"""Durable once renamed: every file and folder an export writes synced to disk (`fsync`)
before the rename that makes it visible, and the folder holding it after (see `files`).
Folders are synced where the platform allows it (POSIX; not Windows).
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["sync_file", "sync_folder", "sync_tree"]


def sync_folder(folder: Path) -> None:
    """Makes `folder`'s entries (names created, renamed, removed in it) durable."""
    if os.name != "posix":  # Windows cannot open a folder to sync it
        return
    descriptor = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def sync_file(path: Path) -> None:
    """Makes the content of the file `path` durable."""
    descriptor = os.open(path, os.O_RDONLY if os.name == "posix" else os.O_RDWR)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def sync_tree(written: Path) -> None:
    """Syncs the file `written`, or every file and folder under the folder `written`."""
    if written.is_symlink():
        return  # the link's own entry is synced with the folder holding it
    if not written.is_dir():
        sync_file(written)
        return
    for folder, _, names in os.walk(written, topdown=False):
        for name in names:
            path = Path(folder, name)
            if not path.is_symlink():
                sync_file(path)
        sync_folder(Path(folder))
