"""Interval arithmetic on sorted, disjoint ``(start, end)`` lists (microseconds).

Time unions are what make busy/idle numbers honest: summing kernel durations double-counts
overlapping streams. Every function is linear in its inputs (after the one sort in ``merge``).
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable

Ranges = list[tuple[float, float]]


def merge(intervals: Iterable[tuple[float, float]]) -> Ranges:
    """Union of possibly overlapping intervals, sorted and disjoint. Touching intervals join."""
    return merge_sorted(sorted(intervals))


def merge_sorted(intervals: Iterable[tuple[float, float]]) -> Ranges:
    """``merge`` for input already sorted by start (skips the sort)."""
    out: Ranges = []
    append = out.append
    cur_s = cur_e = None
    for start, end in intervals:
        if end <= start:
            continue
        if cur_e is not None and start <= cur_e:
            if end > cur_e:
                cur_e = end
        else:
            if cur_e is not None:
                append((cur_s, cur_e))
            cur_s, cur_e = start, end
    if cur_e is not None:
        append((cur_s, cur_e))
    return out


def total(ranges: Ranges) -> float:
    return sum(end - start for start, end in ranges)


def intersect(a: Ranges, b: Ranges) -> Ranges:
    out: Ranges = []
    append = out.append
    i = j = 0
    na, nb = len(a), len(b)
    while i < na and j < nb:
        a0, a1 = a[i]
        b0, b1 = b[j]
        start = a0 if a0 > b0 else b0
        if a1 < b1:
            if start < a1:
                append((start, a1))
            i += 1
        else:
            if start < b1:
                append((start, b1))
            j += 1
    return out


def subtract(a: Ranges, b: Ranges) -> Ranges:
    """Parts of ``a`` not covered by ``b``."""
    out: Ranges = []
    append = out.append
    j = 0
    nb = len(b)
    for start, end in a:
        cur = start
        while j < nb and b[j][1] <= cur:
            j += 1
        k = j
        while k < nb:
            b0, b1 = b[k]
            if b0 >= end:
                break
            if b0 > cur:
                append((cur, b0))
            if b1 > cur:
                cur = b1
            if cur >= end:
                break
            k += 1
        if cur < end:
            append((cur, end))
    return out


def gaps(ranges: Ranges, start: float, end: float) -> Ranges:
    """The holes of ``ranges`` inside ``[start, end]``."""
    return subtract([(start, end)], ranges) if end > start else []


class RangeIndex:
    """Fast "how much of these ranges lies in [a, b]" and "what covers t" queries."""

    def __init__(self, ranges: Ranges) -> None:
        self.ranges = ranges
        self.starts = [s for s, _ in ranges]
        self.prefix = [0.0]
        acc = 0.0
        for s, e in ranges:
            acc += e - s
            self.prefix.append(acc)

    def _covered_before(self, t: float) -> float:
        i = bisect_right(self.starts, t)  # ranges[:i] start at or before t
        if i == 0:
            return 0.0
        s, e = self.ranges[i - 1]
        return self.prefix[i - 1] + (min(e, t) - s)

    def covered(self, a: float, b: float) -> float:
        if b <= a:
            return 0.0
        return self._covered_before(b) - self._covered_before(a)

    def covering(self, t: float) -> tuple[float, float] | None:
        i = bisect_right(self.starts, t)
        if i and self.ranges[i - 1][1] > t:
            return self.ranges[i - 1]
        return None

    def next_start(self, t: float) -> float | None:
        """Start of the first range that begins after ``t``."""
        i = bisect_right(self.starts, t)
        return self.starts[i] if i < len(self.starts) else None

