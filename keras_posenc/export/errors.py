"""The errors of the export package."""

from __future__ import annotations


class ExportError(RuntimeError):
    """An export that cannot be written correctly (the message says why and what to do)."""


class VerificationError(ExportError):
    """A verification that failed; `report` holds the full report that says where."""

    def __init__(self, message: str, report: dict):
        super().__init__(message)
        self.report = report
