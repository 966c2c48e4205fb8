"""Interval arithmetic behind every busy/idle number, checked against a per-point model."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gputop.diagnostics.trace.measuring.intervals import (
    RangeIndex,
    gaps,
    intersect,
    merge,
    subtract,
    total,
)

# Integer endpoints on a small grid: a point model (which half-unit cells are covered) is then
# exact, and the strategies hit touching and nested intervals often.
interval = st.tuples(st.integers(0, 40), st.integers(0, 12)).map(lambda t: (t[0], t[0] + t[1]))
interval_lists = st.lists(interval, max_size=12)


def cells(ranges) -> set[int]:
    """Covered unit cells [k, k+1)."""
    out = set()
    for s, e in ranges:
        out.update(range(int(s), int(e)))
    return out


def well_formed(ranges) -> bool:
    return all(s < e for s, e in ranges) and all(a[1] < b[0] for a, b in zip(ranges, ranges[1:]))


@settings(max_examples=300, deadline=None)
@given(interval_lists)
def test_merge_is_the_union_sorted_and_disjoint(raw):
    merged = merge(raw)
    assert well_formed(merged)
    assert cells(merged) == cells(raw)
    assert total(merged) == len(cells(raw))


@settings(max_examples=300, deadline=None)
@given(interval_lists, interval_lists)
def test_intersect_and_subtract_match_set_algebra(a_raw, b_raw):
    a, b = merge(a_raw), merge(b_raw)
    inter, diff = intersect(a, b), subtract(a, b)
    assert cells(inter) == cells(a) & cells(b)
    assert cells(diff) == cells(a) - cells(b)
    assert all(s < e for s, e in inter + diff)
    # Intersection and difference partition a.
    assert total(inter) + total(diff) == total(a)


@settings(max_examples=200, deadline=None)
@given(interval_lists, st.integers(0, 55), st.integers(0, 55))
def test_range_index_counts_covered_time_in_any_window(raw, x, y):
    merged = merge(raw)
    lo, hi = min(x, y), max(x, y)
    index = RangeIndex(merged)
    assert index.covered(lo, hi) == len(cells(merged) & set(range(lo, hi)))
    assert total(gaps(merged, lo, hi)) == (hi - lo) - index.covered(lo, hi)


@settings(max_examples=200, deadline=None)
@given(interval_lists, st.integers(0, 55))
def test_range_index_point_queries(raw, t):
    merged = merge(raw)
    index = RangeIndex(merged)
    cover = index.covering(t + 0.5)
    assert (cover is not None) == (t in cells(merged))
    nxt = index.next_start(t + 0.5)
    later = [s for s, _ in merged if s > t + 0.5]
    assert nxt == (min(later) if later else None)
