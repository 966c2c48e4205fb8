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
# Cards the user pinned (key c) stay while the table keeps this many lines (a few rows).
PINNED_TABLE_LINES = 5
# Findings: under FINDINGS_MIN_WIDTH a one-line banner (and `f` for the full view); from
# there a panel below the process table, full width; from SIDE_MIN_WIDTH beside it, as wide
# as its list needs, while the table keeps TABLE_MIN_WIDTH (its fixed columns and ~40 cells
# of command).
FINDINGS_MIN_WIDTH = 120
SIDE_MIN_WIDTH = 160
TABLE_MIN_WIDTH = 100
SIDE_MIN = 40


@dataclass(frozen=True)
class Plan:
    compact: bool
    columns: int  # cards per row
    card_height: int
    gpu_lines: int  # height of the GPU area
    findings: bool  # the findings panel is shown (else the one-line banner)
    findings_at: str = "banner"  # "side" | "below" | "banner"
    findings_size: int = 0  # side: the panel's width; below: its height

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


def plan_layout(width: int, height: int, n_gpus: int, compact: bool | None = None,
                findings_width: int = 0, findings_lines: int = 0) -> Plan:
    """``compact`` None lets the size decide; True/False is the user's choice (key c).
    ``findings_width``: the cells the findings list needs (border included);
    ``findings_lines``: the lines the findings view needs."""
    gpus = _plan_gpus(width, height, n_gpus, compact)
    lower = max(0, height - FIXED_LINES - gpus.gpu_lines)
    if width < FINDINGS_MIN_WIDTH:
        return gpus
    if width >= SIDE_MIN_WIDTH and width - TABLE_MIN_WIDTH >= SIDE_MIN:
        side = max(SIDE_MIN, min(findings_width or SIDE_MIN, width - TABLE_MIN_WIDTH))
        return Plan(gpus.compact, gpus.columns, gpus.card_height, gpus.gpu_lines, True,
                    "side", side)
    # Below the table: the list and the selected finding, while the table keeps its header
    # and TABLE_MIN_LINES - 1 rows. Cards that grew with spare room give it back first: the
    # list of findings and the selected one read more than a taller chart.
    wanted = findings_lines + 2 if findings_lines else 5
    if not gpus.compact and wanted > lower - TABLE_MIN_LINES:
        rows = gpus.gpu_lines // gpus.card_height
        spare = (gpus.card_height - CARD_MIN_HEIGHT) * rows
        give = min(spare, wanted - (lower - TABLE_MIN_LINES))
        if give > 0 and rows:
            card_height = gpus.card_height - -(-give // rows)
            gpus = Plan(False, gpus.columns, card_height, rows * card_height, False)
            lower = max(0, height - FIXED_LINES - gpus.gpu_lines)
    below = max(5, min(wanted, lower - TABLE_MIN_LINES))
    return Plan(gpus.compact, gpus.columns, gpus.card_height, gpus.gpu_lines, True, "below",
                below)


def _plan_gpus(width: int, height: int, n_gpus: int, compact: bool | None) -> Plan:
    if n_gpus <= 0:
        return Plan(False, 1, CARD_MIN_HEIGHT, 3, False)
    columns, rows = card_grid(n_gpus, width)
    room = height - FIXED_LINES - TABLE_MIN_LINES
    fits = rows * CARD_MIN_HEIGHT <= room
    # Compact follows the size unless pinned (key c); cards pinned on a terminal where they
    # leave the process table fewer than PINNED_TABLE_LINES are not kept: the table must
    # always be there.
    if compact is False and rows * CARD_MIN_HEIGHT > height - FIXED_LINES - PINNED_TABLE_LINES:
        compact = None
    if compact is None:
        compact = not fits
    compact_lines = min(n_gpus, max(1, (height - FIXED_LINES) // 2))
    if compact:
        return Plan(True, columns, CARD_MIN_HEIGHT, compact_lines, False)
    # Cards may grow a little with room to spare, but the table keeps most of the rest.
    card_height = max(CARD_MIN_HEIGHT,
                      min(CARD_MAX_HEIGHT, int((height - FIXED_LINES) * 0.55) // rows))
    return Plan(False, columns, card_height, rows * card_height, False)
