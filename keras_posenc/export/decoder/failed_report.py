"""The report of a failed `save_decoder` verification, beside the folder it did not write.

`<folder>.verification-failed.json` is written only where no file is, or where the file
there is one of these reports (its `written_by` field says so); a later success removes
only such a report. A file of the user's at that name is never replaced or removed: the
report then stays on the `VerificationError` alone, and its message says why.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from keras_posenc.export.files import write_json

WRITTEN_BY = "keras_posenc.export.save_decoder"


def failed_report_path(folder: str | os.PathLike) -> Path:
    """Where `save_decoder` leaves the report of a failed verification (next to `folder`)."""
    folder = Path(folder)
    return folder.with_name(folder.name + ".verification-failed.json")


def _ours(path: Path) -> bool:
    """Whether the file at `path` is a report `save_decoder` wrote."""
    if path.is_symlink() or not path.is_file():
        return False
    try:
        content = json.loads(path.read_text())
    except (OSError, ValueError):  # UnicodeDecodeError is a ValueError
        return False
    return isinstance(content, dict) and content.get("written_by") == WRITTEN_BY


def keep_failed_report(report: dict, folder: str | os.PathLike) -> str:
    """Writes `report` (marked with `written_by`) beside `folder` unless a file that is
    not one of these reports is there; returns the sentence the error message ends with."""
    report["written_by"] = WRITTEN_BY
    path = failed_report_path(folder)
    if (path.exists() or path.is_symlink()) and not _ours(path):
        return (
            f" The report is on this error's `.report` only: {path} exists and was not "
            "written by save_decoder, so it is left as it is."
        )
    write_json(report, path)
    return f" The report: {path}."


def remove_failed_report(folder: str | os.PathLike) -> None:
    """Removes the failure report beside `folder` if save_decoder wrote it."""
    path = failed_report_path(folder)
    if _ours(path):
        path.unlink(missing_ok=True)
