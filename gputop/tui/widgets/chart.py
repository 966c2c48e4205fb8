"""A small braille line-area chart with a fixed y-range, and height-1 block sparklines.

Built here rather than on plotext or the built-in Sparkline: the built-in one rescales to its
data (a 3 % blip would fill it), and plotext-based widgets cost several times more per frame.
Each braille cell holds 2x4 dots, so a chart w cells wide shows 2w time bins and 4h levels.
"""

from __future__ import annotations

import math

import numpy as np
from rich.cells import cell_len
from rich.segment import Segment
from textual.strip import Strip
from textual.widget import Widget

# Dot bits of one braille cell, from the bottom row up, for the left and right dot columns.
_LEFT = (0x40, 0x04, 0x02, 0x01)
_RIGHT = (0x80, 0x20, 0x10, 0x08)
# _CELLS[left * 5 + right]: the cell with the bottom `left` / `right` dots of each column filled.
_CELLS = [
    chr(0x2800 + sum(_LEFT[:left]) + sum(_RIGHT[:right]))
    for left in range(5)
    for right in range(5)
]
_BLOCKS = " ▁▂▃▄▅▆▇█"
_EMPTY = np.zeros(0)


def resample(t: np.ndarray, v: np.ndarray, start: float, end: float, bins: int) -> np.ndarray:
    """Mean of ``v`` per time bin over [start, end]; NaN where a bin has no sample.

    A bin narrower than the sampling interval would leave a comb of holes, so a hole shorter
    than the typical spacing of the samples takes the value before it.
    """
    out = np.full(bins, np.nan)
    if bins <= 0 or end <= start or len(t) == 0:
        return out
    keep = (t >= start) & (t <= end) & ~np.isnan(v)
    if not keep.any():
        return out
    tk, vk = t[keep], v[keep].astype(np.float64)
    idx = np.minimum(((tk - start) / (end - start) * bins).astype(np.int64), bins - 1)
    sums = np.bincount(idx, weights=vk, minlength=bins)
    counts = np.bincount(idx, minlength=bins)
    filled = counts > 0
    out[filled] = sums[filled] / counts[filled]
    if len(tk) > 1:
        spacing = _median(np.diff(tk)) / (end - start) * bins
        reach = math.ceil(spacing)
        if reach > 1:
            positions = np.arange(bins)
            last = np.maximum.accumulate(np.where(filled, positions, -1))
            hole = ~filled & (last >= 0) & (positions - last < reach) & (positions < idx[-1])
            out[hole] = out[last[hole]]
    return out


def _levels(values: np.ndarray, vmax: float | np.ndarray, steps: int) -> np.ndarray:
    """Values to 0..steps; -1 where there is no data; any sample shows at least one step."""
    scaled = np.where(np.isnan(values), -1.0, np.clip(values / vmax, 0.0, 1.0) * steps)
    levels = np.rint(scaled).astype(np.int64)
    levels[(levels == 0) & (scaled >= 0)] = 1
    return levels


def braille_lines(values: np.ndarray, vmax: float, height: int) -> list[str]:
    """Rows (top first) of an area chart; ``values`` has two entries per cell, NaN = no data."""
    if len(values) % 2:
        values = np.append(values, np.nan)
    if vmax <= 0 or not len(values):
        return [" " * (len(values) // 2)] * height
    return _braille_many(values[None, :], [vmax], height)[0]


def sparkline(values: np.ndarray, vmax: float) -> str:
    """One row of block characters, 8 levels; blank where there is no data."""
    if vmax <= 0:
        return " " * len(values)
    return "".join([_BLOCKS[max(0, c)] for c in _levels(values, vmax, 8).tolist()])


def spark_series(t: np.ndarray, v: np.ndarray, start: float, end: float, vmax: float,
                 width: int) -> str:
    return sparkline(resample(t, v, *aligned(start, end, width), width), vmax)


class BrailleChart(Widget):
    """A time series over a fixed window and a fixed y-range; one row becomes a sparkline.

    The rows are drawn when the data arrives and the widget repaints only if they changed:
    a steady GPU costs no paint at all.
    """

    DEFAULT_CSS = """
    BrailleChart { width: 1fr; height: 2; min-height: 1; }
    """

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self._data: tuple = (_EMPTY, _EMPTY, 0.0, 0.0, 0.0)
        self._rows: list[str] = []
        self._rows_size: tuple[int, int] = (0, 0)
        self._strips: list[Strip] | None = None
        self._strips_style = None

    def set_series(self, t: np.ndarray, v: np.ndarray, start: float, end: float,
                   vmax: float | None) -> None:
        """Show ``v`` over [start, end] against 0..vmax (None: the range is unknown)."""
        self._data = (t, v, start, end, vmax or 0.0)
        self._draw()

    def on_resize(self) -> None:
        self._draw()

    def _draw(self) -> None:
        width, height = self.size.width, self.size.height
        if width <= 0 or height <= 0:
            return
        rows = chart_rows(*self._data, width=width, height=height)
        if rows != self._rows or self._rows_size != (width, height):
            self._rows, self._rows_size = rows, (width, height)
            self._strips = None
            self.refresh()

    def render_line(self, y: int) -> Strip:
        style = self.rich_style
        if self._strips is None or self._strips_style != style:
            width = self.size.width
            self._strips = [Strip([Segment(row, style)], cell_len(row)).adjust_cell_length(width,
                                                                                           style)
                            for row in self._rows]
            self._strips_style = style
        if y < len(self._strips):
            return self._strips[y]
        return Strip.blank(self.size.width, style)


def aligned(start: float, end: float, bins: int) -> tuple[float, float]:
    """The same span with its bin edges on multiples of the bin width: a new sample then
    changes only the last bin, and the chart scrolls one whole bin at a time, so most ticks
    repaint a few cells instead of the whole chart."""
    width = (end - start) / bins
    if width <= 0:
        return start, end
    top = math.ceil(end / width) * width
    return top - (end - start), top


def chart_rows(t: np.ndarray, v: np.ndarray, start: float, end: float, vmax: float, *,
               width: int, height: int) -> list[str]:
    if not vmax:
        return ["n/a".center(width)] + [""] * (height - 1)
    if height == 1:
        return [sparkline(resample(t, v, *aligned(start, end, width), width), vmax)]
    bins = width * 2
    return braille_lines(resample(t, v, *aligned(start, end, bins), bins), vmax, height)


def chart_rows_many(t: np.ndarray, values: list[np.ndarray], start: float, end: float,
                    vmaxes: list[float], *, width: int, heights: list[int]) -> list[list[str]]:
    """``chart_rows`` for several series over the same times (the fields of every GPU:
    they are recorded together), binned in one pass: the same rows, a fraction of the numpy
    calls."""
    out: list[list[str] | None] = [None] * len(values)
    rows = [i for i, (vmax, h) in enumerate(zip(vmaxes, heights)) if vmax and h > 1]
    braille = set(rows)
    for i, (v, vmax, h) in enumerate(zip(values, vmaxes, heights)):
        if i not in braille:
            out[i] = chart_rows(t, v, start, end, vmax, width=width, height=h)
    if not rows:
        return out  # type: ignore[return-value]
    bins = width * 2
    s, e = aligned(start, end, bins)
    k = len(rows)
    binned = np.full((k, bins), np.nan)
    if bins > 0 and e > s and len(t):
        in_span = (t >= s) & (t <= e)
        tk = t[in_span]
        if len(tk):
            V = np.vstack([values[i][in_span] for i in rows]).astype(np.float64)
            valid = ~np.isnan(V)
            idx = np.minimum(((tk - s) / (e - s) * bins).astype(np.int64), bins - 1)
            flat = (np.arange(k)[:, None] * bins + idx[None, :])[valid]
            sums = np.bincount(flat, weights=V[valid], minlength=k * bins).reshape(k, bins)
            counts = np.bincount(flat, minlength=k * bins).reshape(k, bins)
            filled = counts > 0
            binned[filled] = sums[filled] / counts[filled]
            if len(tk) > 1:
                spacing = _median(np.diff(tk)) / (e - s) * bins
                reach = math.ceil(spacing)
                if reach > 1:
                    positions = np.arange(bins)
                    last = np.maximum.accumulate(np.where(filled, positions, -1), axis=1)
                    last_sample = np.where(valid, idx[None, :], -1).max(axis=1)
                    hole = (~filled & (last >= 0) & (positions[None, :] - last < reach)
                            & (positions[None, :] < last_sample[:, None]))
                    r, c = np.nonzero(hole)
                    binned[r, c] = binned[r, last[r, c]]
    # Rows of one height in one array pass (a card's charts differ by a line at most).
    for height in sorted({heights[i] for i in rows}):
        group = [n for n, i in enumerate(rows) if heights[i] == height]
        drawn = _braille_many(binned[group], [vmaxes[rows[n]] for n in group], height)
        for n, lines in zip(group, drawn):
            out[rows[n]] = lines
    return out  # type: ignore[return-value]


def _median(values: np.ndarray) -> float:
    """np.median of a small array, without its overhead (the same arithmetic)."""
    ordered = np.sort(values)
    half = len(ordered) // 2
    if len(ordered) % 2:
        return float(ordered[half])
    return float((ordered[half - 1] + ordered[half]) / 2.0)


def _braille_many(binned: np.ndarray, vmaxes: list[float], height: int) -> list[list[str]]:
    """Rows (top first) of the area chart of each row of ``binned`` (an even number of bins,
    vmax > 0), all of one height, in one array pass: the dots each row's cells hold, from the
    top row down."""
    levels = _levels(binned, np.asarray(vmaxes, dtype=np.float64)[:, None], height * 4)
    bases = np.arange(height - 1, -1, -1)[None, :, None] * 4
    dots = np.minimum(np.maximum(levels[:, None, :] - bases, 0), 4)
    codes = (dots[:, :, 0::2] * 5 + dots[:, :, 1::2]).tolist()
    cells = _CELLS
    return [["".join([cells[c] for c in row]) for row in chart] for chart in codes]
