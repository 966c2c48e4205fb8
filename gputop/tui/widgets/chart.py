"""A small braille line-area chart with a fixed y-range, and height-1 block sparklines.

Built here rather than on plotext or the built-in Sparkline: the built-in one rescales to its
data (a 3 % blip would fill it), and plotext-based widgets cost several times more per frame.
Each braille cell holds 2x4 dots, so a chart w cells wide shows 2w time bins and 4h levels.

Pure Python (the live monitor loads no numpy): the bins the shared times fall in are
found once per frame and reused by every series over them, and a braille cell's column of
characters comes from a table per height.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from collections.abc import Sequence
from operator import getitem, truediv
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
    times that several series share (the fields of every GPU, recorded together), and kept
    for the next call over the same times and span (``binning``)."""

    __slots__ = ("key", "source", "bins", "span", "lo", "hi", "take", "idx", "runs", "slices",
                 "lengths", "run_bins", "times", "reach", "spread")

    def __init__(self, t: list[float], start: float, end: float, bins: int) -> None:
        self.key, self.source = (start, end, bins), t
        self.bins, self.span = bins, end - start
        in_order = t == sorted(t)  # always, from the history: one C pass
        if in_order:
            lo = bisect_left(t, start)
            hi = max(lo, bisect_right(t, end))
            self.lo, self.hi, self.take = lo, hi, None
            times = t[lo:hi]
        else:  # never from the history; kept correct anyway
            self.take = [i for i, x in enumerate(t) if start <= x <= end]
            self.lo = self.hi = 0
            times = [t[i] for i in self.take]
        self.times = times
        span, last = self.span, bins - 1
        self.idx = idx = [min(int((x - start) / span * bins), last) for x in times]
        # Runs of samples in one bin (bins in order): a series' bin means are then sums of
        # slices, in C, in the order numpy's bincount added them.
        self.runs: list[tuple[int, int, int]] | None = None
        self.slices: list[slice] = []
        self.lengths: list[int] = []
        self.run_bins: list[int] = []
        if in_order and idx:
            runs, first, n = [], 0, len(idx)
            while first < n:
                b = idx[first]
                past = bisect_right(idx, b, first)
                runs.append((b, first, past))
                first = past
            self.runs = runs
            self.slices = [slice(a, z) for _, a, z in runs]
            self.lengths = [z - a for _, a, z in runs]
            self.run_bins = [b for b, _, _ in runs]
        self.reach = self._reach(times)
        self.spread: list[int] | None = None

    def _reach(self, times: Sequence[float]) -> int:
        """How many bins a hole may span and still take the value before it: the typical
        spacing of the samples, in bins."""
        if len(times) < 2:
            return 0
        spacing = _median([b - a for a, b in zip(times, times[1:])]) / self.span * self.bins
        return math.ceil(spacing)

    def cut(self, v: Any) -> list[float]:
        v = _floats(v)
        return v[self.lo:self.hi] if self.take is None else [v[i] for i in self.take]

    def filled(self, v: list[float]) -> tuple[list[int], list[float]]:
        """The bins that hold a sample of ``v`` (cut to the span), in order, and their means."""
        total = sum(v)
        if self.runs is not None and total == total:  # in order, no NaN: a sum per run
            return self.run_bins, list(map(truediv, map(sum, map(v.__getitem__, self.slices)),
                                           self.lengths))
        sums = [0.0] * self.bins
        counts = [0] * self.bins
        for b, x in zip(self.idx, v):
            if x == x:
                sums[b] += x
                counts[b] += 1
        bins = [b for b in range(self.bins) if counts[b]]
        return bins, [sums[b] / counts[b] for b in bins]


# The last binning made: the next chart over the same times and span reuses it (the fields of
# a GPU, each cut into arrays of its own, and the sparklines of the compact rows).
_last: list[_Binning] = []


def binning(t: Any, start: float, end: float, bins: int) -> _Binning:
    times = _floats(t)
    if not isinstance(times, list):
        times = list(times)
    if _last:
        cached = _last[0]
        if cached.key == (start, end, bins) and cached.source == times:  # one C compare
            return cached
    made = _Binning(times, start, end, bins)
    _last[:] = [made]
    return made


def _spread(bins: int, filled: list[int], reach: int) -> list[int]:
    """For each bin, the index in ``filled`` (the bins holding a sample, in order) of the value
    it shows, -1 for none: its own, or, for a hole shorter than ``reach`` bins before the last
    sample, the one before it (a bin narrower than the sampling interval would otherwise
    leave a comb of holes)."""
    src = [-1] * bins
    if not filled:
        return src
    last_sample = filled[-1]
    for j, (b, following) in enumerate(zip(filled, filled[1:] + [bins])):
        src[b] = j
        if reach > 1:
            stop = min(b + reach, following, last_sample)
            if stop > b + 1:
                src[b + 1:stop] = [j] * (stop - b - 1)
    return src


def _filled_out(made: _Binning, filled: list[int], values: list, reach: int,
                empty: Any) -> list:
    """``values`` of the ``filled`` bins spread over the bins (``_spread``), ``empty``
    elsewhere. The spread of a series without a missing value is its times': made once."""
    if filled is made.run_bins and reach == made.reach:
        if made.spread is None:
            made.spread = _spread(made.bins, filled, reach)
        src = made.spread
    else:
        src = _spread(made.bins, filled, reach)
    return list(map([*values, empty].__getitem__, src))  # -1: the last, ``empty``


def resample(t: Any, v: Any, start: float, end: float, bins: int) -> list[float]:
    """Mean of ``v`` per time bin over [start, end]; NaN where a bin has no sample.

    A bin narrower than the sampling interval would leave a comb of holes, so a hole shorter
    than the typical spacing of the samples takes the value before it.
    """
    if bins <= 0 or end <= start or len(t) == 0:
        return [_NAN] * max(bins, 0)
    made = binning(t, start, end, bins)
    v = made.cut(v)
    filled, means = made.filled(v)
    reach = made.reach
    if any(x != x for x in v):  # the spacing of the samples that have a value
        reach = made._reach([x for x, y in zip(made.times, v) if y == y])
    return _filled_out(made, filled, means, reach, _NAN)


def _levels(values: Sequence[float], vmax: float, steps: int) -> list[int]:
    """Values to 0..steps; -1 where there is no data; any sample shows at least one step."""
    return [-1 if x != x else (round((0.0 if r < 0.0 else 1.0 if r > 1.0 else r) * steps) or 1)
            for x in values for r in (x / vmax,)]


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
    made = binning(t, s, e, bins) if bins > 0 and e > s and len(t) else None
    for i in rows:
        height = heights[i]
        if made is None or not made.times:
            levels = [-1] * bins
        else:  # levels of the filled bins only; the holes copy them (the spacing of all times)
            filled, means = made.filled(made.cut(values[i]))
            levels = _filled_out(made, filled, _levels(means, vmaxes[i], height * 4),
                                 made.reach, -1)
        out[i] = _braille_levels(levels, height)
    return out  # type: ignore[return-value]


def _median(values: Any) -> float:
    """The median (as numpy's: the mean of the two middle values of an even count)."""
    ordered = sorted(_floats(values))
    half = len(ordered) // 2
    if len(ordered) % 2:
        return float(ordered[half])
    return float((ordered[half - 1] + ordered[half]) / 2.0)


# Per chart height: the column of characters (top first) of a cell whose left and right dot
# columns reach levels a and b, at [a][b]: 0..4h, and -1 (no data) as the last entry.
_COLUMNS: dict[int, list[list[tuple[str, ...]]]] = {}


def _columns(height: int) -> list[list[tuple[str, ...]]]:
    table = _COLUMNS.get(height)
    if table is None:
        bases = [(height - 1 - row) * 4 for row in range(height)]
        levels = [*range(height * 4 + 1), -1]
        table = _COLUMNS[height] = [
            [tuple(_CELLS[min(max(a - base, 0), 4) * 5 + min(max(b - base, 0), 4)]
                   for base in bases) for b in levels] for a in levels]
    return table


def _braille_levels(levels: list[int], height: int) -> list[str]:
    """Rows (top first) of an area chart of ``levels`` (0..4h, -1: no data; an even count)."""
    if not levels:
        return [""] * height
    cells = map(getitem, map(_columns(height).__getitem__, levels[0::2]), levels[1::2])
    return ["".join(row) for row in zip(*cells)]


def _braille_many(binned: Any, vmaxes: list[float], height: int) -> list[list[str]]:
    """Rows (top first) of the area chart of each row of ``binned`` (an even number of bins,
    vmax > 0), all of one height."""
    return [_braille_levels(_levels(_floats(values), vmax, height * 4), height)
            for values, vmax in zip(binned, vmaxes)]
