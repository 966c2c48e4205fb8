"""The error of a memory report that cannot be read, apart from the reader (report.py, which
loads msgspec): the monitor catches it without loading the reader."""

from __future__ import annotations


class ReportError(Exception):
    """The report cannot be read; the message is one line, for the user."""
