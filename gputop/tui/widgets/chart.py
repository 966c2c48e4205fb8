"""A small braille line-area chart with a fixed y-range, and height-1 block sparklines.

Built here rather than on plotext or the built-in Sparkline: the built-in one rescales to its
data (a 3 % blip would fill it), and plotext-based widgets cost several times more per frame.
Each braille cell holds 2x4 dots, so a chart w cells wide shows 2w time bins and 4h levels.

Pure Python (the live monitor loads no numpy, issue 40): the bins the shared times fall in are
found once per frame and reused by every series over them, and a braille cell's column of
characters comes from a table per height.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from collections.abc import Sequence
from typing import Any

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
_EMPTY: tuple[float, ...] = ()
_NAN = math.nan


def _floats(values: Any) -> Sequence[float]:
    """Plain Python floats of a sequence (an ``array``'s or numpy's tolist is one C call)."""
    tolist = getattr(values, "tolist", None)
    return tolist() if tolist is not None else values



class _Binning:
    """Where samples at times ``t`` fall among ``bins`` bins over [start, end]: found once for
    times that several series share (the fields of every GPU, recorded together)."""

    __slots__ = ("bins", "span", "lo", "hi", "take", "idx", "runs", "times", "reach")

    def __init__(self, t: Any, start: float, end: float, bins: int) -> None:
        t = _floats(t)
        self.bins, self.span = bins, end - start
        n = len(t)
        in_order = all(a <= b for a, b in zip(t, t[1:])) if n > 1 else True
        if in_order:
            lo = bisect_left(t, start)
            hi = max(lo, bisect_right(t, end))
            self.lo, self.hi, self.take = lo, hi, None
            times = list(t[lo:hi])
        else:  # never from the history; kept correct anyway
            self.take = [i for i, x in enumerate(t) if start <= x <= end]
            self.lo = self.hi = 0
            times = [t[i] for i in self.take]
        self.times = times
        span, last = self.span, bins - 1
        self.idx = idx = [min(int((x - start) / span * bins), last) for x in times]
        # Runs of samples in one bin (bin, first, past-last), when the bins are in order.
        self.runs: list[tuple[int, int, int]] | None = None
        if in_order and idx:
            runs, first = [], 0
            for i in range(1, len(idx)):
                if idx[i] != idx[i - 1]:
                    runs.append((idx[first], first, i))
                    first = i
            runs.append((idx[first], first, len(idx)))
            self.runs = runs
        self.reach = self._reach(times)

    def _reach(self, times: Sequence[float]) -> int:
        """How many bins a hole may span and still take the value before it: the typical
        spacing of the samples, in bins."""
        if len(times) < 2:
            return 0
        spacing = _median([b - a for a, b in zip(times, times[1:])]) / self.span * self.bins
        return math.ceil(spacing)

    def cut(self, v: Any) -> Sequence[float]:
        v = _floats(v)
        return v[self.lo:self.hi] if self.take is None else [v[i] for i in self.take]

    def means(self, v: Sequence[float]) -> tuple[list[float], list[int], int]:
        """Mean per bin of ``v`` (cut to the span), NaN where a bin has no sample; the
        samples per bin; the bin of the last sample (-1: none)."""
        bins = self.bins
        out = [_NAN] * bins
        counts = [0] * bins
        total = sum(v)
        if self.runs is not None and total == total:  # in order and no NaN: a sum per run
            for b, a, z in self.runs:
                out[b] = sum(v[a:z]) / (z - a)
                counts[b] = z - a
            return out, counts, self.idx[-1]
        sums = [0.0] * bins
        last = -1
        for b, x in zip(self.idx, v):
            if x == x:
                sums[b] += x
                counts[b] += 1
                if b > last:
                    last = b
        for b in range(bins):
            if counts[b]:
                out[b] = sums[b] / counts[b]
        return out, counts, last


def _fill_holes(out: list[float], counts: list[int], reach: int, last_sample: int) -> None:
    """A bin narrower than the sampling interval would leave a comb of holes: a hole shorter
    than the typical spacing of the samples takes the value before it."""
    if reach <= 1:
        return
    last = -1
    for p in range(min(len(out), last_sample)):
        if counts[p]:
            last = p
        elif last >= 0 and p - last < reach:
            out[p] = out[last]


def resample(t: Any, v: Any, start: float, end: float, bins: int) -> list[float]:
    """Mean of ``v`` per time bin over [start, end]; NaN where a bin has no sample.

    A bin narrower than the sampling interval would leave a comb of holes, so a hole shorter
    than the typical spacing of the samples takes the value before it.
    """
    if bins <= 0 or end <= start or len(t) == 0:
        return [_NAN] * max(bins, 0)
    binning = _Binning(t, start, end, bins)
    return _resampled(binning, binning.cut(v))


def _resampled(binning: _Binning, v: Sequence[float]) -> list[float]:
    out, counts, last_sample = binning.means(v)
    if last_sample < 0:
        return out
    reach = binning.reach
    if any(x != x for x in v):  # the spacing of the samples that have a value
        reach = binning._reach([x for x, y in zip(binning.times, v) if y == y])
    _fill_holes(out, counts, reach, last_sample)
    return out


def _levels(values: Sequence[float], vmax: float, steps: int) -> list[int]:
    """Values to 0..steps; -1 where there is no data; any sample shows at least one step."""
    out = []
    for x in values:
        if x != x:
            out.append(-1)
            continue
        r = x / vmax
        level = round((0.0 if r < 0.0 else 1.0 if r > 1.0 else r) * steps)
        out.append(level if level else 1)
    return out


def braille_lines(values: Any, vmax: float, height: int) -> list[str]:
    """Rows (top first) of an area chart; ``values`` has two entries per cell, NaN = no data."""
    values = list(_floats(values))
    if len(values) % 2:
        values.append(_NAN)
    if vmax <= 0 or not len(values):
        return [" " * (len(values) // 2)] * height
    return _braille_many([values], [vmax], height)[0]


def sparkline(values: Any, vmax: float) -> str:
    """One row of block characters, 8 levels; blank where there is no data."""
    if vmax <= 0:
        return " " * len(values)
    return "".join([_BLOCKS[max(0, c)] for c in _levels(_floats(values), vmax, 8)])


def spark_series(t: Any, v: Any, start: float, end: float, vmax: float, width: int) -> str:
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
        self._strips_style: Any = None

    def set_series(self, t: Sequence[float], v: Sequence[float], start: float, end: float,
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


def chart_rows(t: Any, v: Any, start: float, end: float, vmax: float, *,
               width: int, height: int) -> list[str]:
    if not vmax:
        return ["n/a".center(width)] + [""] * (height - 1)
    if height == 1:
        return [sparkline(resample(t, v, *aligned(start, end, width), width), vmax)]
    bins = width * 2
    return braille_lines(resample(t, v, *aligned(start, end, bins), bins), vmax, height)


def chart_rows_many(t: Any, values: list[Any], start: float, end: float,
                    vmaxes: list[float], *, width: int, heights: list[int]) -> list[list[str]]:
    """``chart_rows`` for several series over the same times (the fields of every GPU:
    they are recorded together): the bins of the times are found once for all of them."""
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
    binning = _Binning(t, s, e, bins) if bins > 0 and e > s and len(t) else None
    for i in rows:
        if binning is None or not binning.times:
            binned = [_NAN] * bins
        else:
            binned, counts, last_sample = binning.means(binning.cut(values[i]))
            if last_sample >= 0:  # the spacing of all the times, valid or not
                _fill_holes(binned, counts, binning.reach, last_sample)
        out[i] = _braille_many([binned], [vmaxes[i]], heights[i])[0]
    return out  # type: ignore[return-value]


def _median(values: Any) -> float:
    """The median (as numpy's: the mean of the two middle values of an even count)."""
    ordered = sorted(_floats(values))
    half = len(ordered) // 2
    if len(ordered) % 2:
        return float(ordered[half])
    return float((ordered[half - 1] + ordered[half]) / 2.0)


# Per chart height: the column of characters (top first) of a cell whose left and right dot
# columns reach levels a and b (-1..4h), at [a + 1][b + 1].
_COLUMNS: dict[int, list[list[tuple[str, ...]]]] = {}


def _columns(height: int) -> list[list[tuple[str, ...]]]:
    table = _COLUMNS.get(height)
    if table is None:
        bases = [(height - 1 - row) * 4 for row in range(height)]
        levels = range(-1, height * 4 + 1)
        table = _COLUMNS[height] = [
            [tuple(_CELLS[min(max(a - base, 0), 4) * 5 + min(max(b - base, 0), 4)]
                   for base in bases) for b in levels] for a in levels]
    return table


def _braille_many(binned: Any, vmaxes: list[float], height: int) -> list[list[str]]:
    """Rows (top first) of the area chart of each row of ``binned`` (an even number of bins,
    vmax > 0), all of one height: each cell's column of characters from a table."""
    table = _columns(height)
    out = []
    for values, vmax in zip(binned, vmaxes):
        levels = _levels(_floats(values), vmax, height * 4)
        cells = [table[a + 1][b + 1] for a, b in zip(levels[0::2], levels[1::2])]
        out.append(["".join(row) for row in zip(*cells)] if cells else [""] * height)
    return out
