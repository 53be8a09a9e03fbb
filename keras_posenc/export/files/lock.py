"""One writer at a time: the exclusive lock `.NAME.lock` next to an artifact, held from a
writer's first check to its last rename (see `files`); not taken where the platform has no
`fcntl` (Windows).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

from keras_posenc.export.errors import ExportError

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None

__all__ = ["exclusive"]


@contextlib.contextmanager
def exclusive(target: Path) -> Iterator[None]:
    """Holds the lock of `target` (`.NAME.lock` next to it), or raises at once."""
    if fcntl is None:
        yield
        return
    lock = target.parent / f".{target.name}.lock"
    while True:
        try:
            descriptor = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as error:
            raise not_writable(error, target.parent) from error
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(descriptor)
            raise ExportError(
                f"Another export is writing {str(target)!r} right now; wait for it to finish "
                "or write to another path."
            ) from None
        # The previous holder removes the lock file when it is done: a lock taken on a
        # removed file locks nothing, so take it again on the file now there.
        try:
            same = os.stat(lock).st_ino == os.fstat(descriptor).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(descriptor)
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            os.unlink(lock)
        os.close(descriptor)


def not_writable(error: OSError, folder: Path) -> OSError:
    """`error` of writing into `folder`, saying which folder and what to do."""
    return OSError(
        error.errno,
        f"Cannot write into {str(folder)!r} ({error.strerror}); choose a folder you can write to",
        str(folder),
    )
