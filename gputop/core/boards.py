"""Datasheet tables keyed by the board's name, matched one way for every table.

A board is named by NVML (``NVIDIA H100 80GB HBM3``), by a trace (``deviceProperties``) or by a
scenario; each table (``peaks.BOARDS``: peak FLOP/s, ``pcie.BOARDS``: the host link,
``sim.mig``: which boards have MIG) lists rows with a regular expression on that name, most
specific first, and ``BoardTable.lookup`` returns the first row that matches.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Generic, Protocol, TypeVar


class HasPattern(Protocol):
    @property
    def pattern(self) -> str: ...


Row = TypeVar("Row", bound=HasPattern)


class BoardTable(Generic[Row]):
    """Rows matched against a board's name, case-insensitively; the first match wins."""

    def __init__(self, rows: Iterable[Row]) -> None:
        self.rows = tuple(rows)
        self._compiled = tuple((re.compile(r.pattern, re.IGNORECASE), r) for r in self.rows)

    def lookup(self, name: str | None) -> Row | None:
        """The row of the board named ``name``, or None for a board the table does not list."""
        if not name:
            return None
        for pattern, row in self._compiled:
            if pattern.search(name):
                return row
        return None
