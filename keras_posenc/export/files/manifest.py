"""Only ours: every folder the package writes lists its files in a hidden manifest, so that
an existing folder is replaced only when it holds nothing else (see `files`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

__all__ = ["MANIFEST", "files_under", "foreign_files", "write_manifest", "written_by_package"]

MANIFEST = ".keras-posenc-files"


def files_under(folder: Path) -> set[str]:
    """The files (and links) under `folder`, as POSIX paths relative to it."""
    return {
        path.relative_to(folder).as_posix()
        for path in folder.rglob("*")
        if path.is_file() or path.is_symlink()
    }


def written_by_package(folder: str | os.PathLike) -> bool:
    """Whether `folder` holds only files the package wrote there (its manifest lists them)."""
    folder = Path(folder)
    try:
        listed = set(json.loads((folder / MANIFEST).read_text())["files"])
    except (OSError, ValueError, KeyError, TypeError):
        return False
    return files_under(folder) - {MANIFEST} <= listed


def foreign_files(folder: Path) -> list[str]:
    """The files under `folder` its manifest does not list, sorted (what blocks replacing it)."""
    try:
        listed = set(json.loads((folder / MANIFEST).read_text())["files"])
    except (OSError, ValueError, KeyError, TypeError):
        # No manifest: nothing in it is ours, and its first entries say so without a walk
        # of what may be a large tree.
        return sorted(p.name + ("/" if p.is_dir() else "") for p in folder.iterdir())
    return sorted(files_under(folder) - listed - {MANIFEST})


def write_manifest(folder: Path) -> None:
    """Lists the files under `folder` in its manifest."""
    files = sorted(files_under(folder) - {MANIFEST})
    (folder / MANIFEST).write_text(json.dumps({"files": files}, indent=0) + "\n")
