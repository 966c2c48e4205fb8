"""How the screen is divided for a terminal size and a number of GPUs. Pure: decided on resize
and on the compact toggle only, never per tick."""

from __future__ import annotations

import math
from dataclasses import dataclass

CARD_MIN_WIDTH = 40
CARD_MIN_HEIGHT = 12
CARD_MAX_HEIGHT = 18
# Lines that are always there: header, host panel (2), footer.
FIXED_LINES = 4
# The process table keeps at least this many lines (header row included) before GPUs
# switch to one line each.
TABLE_MIN_LINES = 10
FINDINGS_MIN_WIDTH = 120  # below this the findings panel hides and the table takes the width
FINDINGS_WIDTH = 32


@dataclass(frozen=True)
class Plan:
    compact: bool
    columns: int  # cards per row
    card_height: int
    gpu_lines: int  # height of the GPU area
    findings: bool

    @property
    def auto(self) -> str:
        return "compact" if self.compact else "cards"


def card_grid(n_gpus: int, width: int) -> tuple[int, int]:
    """(columns, rows) of cards: as many columns as fit, then balanced across the rows."""
    if n_gpus <= 0:
        return 1, 0
    most = max(1, min(n_gpus, width // CARD_MIN_WIDTH))
    rows = math.ceil(n_gpus / most)
    return math.ceil(n_gpus / rows), rows


def plan_layout(width: int, height: int, n_gpus: int, compact: bool | None = None) -> Plan:
    """``compact`` None lets the size decide; True/False is the user's choice (key c)."""
    findings = width >= FINDINGS_MIN_WIDTH
    if n_gpus <= 0:
        return Plan(False, 1, CARD_MIN_HEIGHT, 3, findings)
    columns, rows = card_grid(n_gpus, width)
    room = height - FIXED_LINES - TABLE_MIN_LINES
    fits = rows * CARD_MIN_HEIGHT <= room
    if compact is None:
        compact = not fits
    compact_lines = min(n_gpus, max(1, (height - FIXED_LINES) // 2))
    if compact:
        return Plan(True, columns, CARD_MIN_HEIGHT, compact_lines, findings)
    # Cards may grow a little with room to spare, but the table keeps most of the rest.
    card_height = max(CARD_MIN_HEIGHT,
                      min(CARD_MAX_HEIGHT, int((height - FIXED_LINES) * 0.55) // rows))
    return Plan(False, columns, card_height, rows * card_height, findings)
