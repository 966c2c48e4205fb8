"""The live rules keep their windows incrementally (running sums for the memory fit, per-GPU
windows trimmed as samples expire): the same answers as fitting the window from scratch."""

from __future__ import annotations

import re

from hypothesis import example, given, settings
from hypothesis import strategies as st

from gputop.diagnostics.live import (
    MEMORY_WINDOW_S,
    LiveDiagnosis,
    _linear_fit,
    _RunningFit,
)
from tests.test_live_rules import GIB, OWN, gpu, proc, snap


@settings(max_examples=200, deadline=None)
@example(points=[(1.0, 0), (0.7265625, 10040721), (0.75, 31032)], keep=2.0)  # 3 points, 1.5 s
@example(points=[(1.0, 1), (0.2109375, 0), (0.203125, 0)], keep=1.0)  # 0.4 s, R^2 near 0.76
@given(
    points=st.lists(st.tuples(st.floats(0.01, 5.0), st.integers(0, 80 * GIB)), min_size=3,
                    max_size=80),
    keep=st.floats(1.0, 120.0),
)
def test_running_fit_matches_a_fit_from_scratch(points, keep):
    fit = _RunningFit()
    t, kept = 1.7e9, []
    for gap, y in points:
        t += gap
        fit.add(t, y)
        kept.append((t, y))
        fit.trim(t - keep)
        kept = [(a, b) for a, b in kept if a >= t - keep]
    assert fit.pairs() == kept
    slope, r2 = fit.fit()
    ref_slope, ref_r2 = _linear_fit([a for a, _ in kept], [float(b) for _, b in kept])
    # Times are kept in whole microseconds (and the reference's own times, floats near 1.7e9,
    # are no finer than 0.24 us): the slopes agree to that resolution. Moving each time by at
    # most eps moves the slope by at most eps * (sum|y - ym| + 2 |slope| sum|x - xm|) / Sxx.
    xs = [a for a, _ in kept]
    ys = [float(b) for _, b in kept]
    xm, ym = sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - xm) ** 2 for x in xs)
    eps = 1e-6
    bound = eps * (sum(abs(y - ym) for y in ys) + 2 * abs(ref_slope) * sum(abs(x - xm) for x in xs))
    assert abs(slope - ref_slope) <= 1e-5 * abs(ref_slope) + 1.0 + (bound / sxx if sxx else 0)
    # R^2 moves with the times the same way: relative to the span the points cover.
    span = max(xs) - min(xs)
    assert abs(r2 - ref_r2) <= 1e-6 + (8 * eps / span if span else 0)


def test_memory_growth_fits_only_the_last_five_minutes_as_samples_expire():
    """A leak that stops: after 400 s of rise the fit covers the last 300 s only, and once
    the flat part fills the window the finding clears."""

    def make(t: float):
        used = (10 + 0.05 * min(t, 400.0)) * GIB
        return snap(t, gpu(util=97, mem_used=used, processes=(proc(),)))

    diagnosis = LiveDiagnosis(own_pid=OWN)
    growth = []
    for i in range(1100):
        diagnosis.update(make(float(i)))
        found = [f for f in diagnosis.findings() if f.id == "memory-growth"]
        growth.append(found[0] if found else None)
    at_399 = growth[399]
    assert at_399 is not None
    span = re.search(r"in (\d+) s", at_399.evidence)
    assert span and int(span.group(1)) == MEMORY_WINDOW_S  # the window, not 399 s
    assert "history so far" not in at_399.evidence
    # 15 GiB over 300 s: 51 MiB/s, a perfect line.
    assert "(51 MiB/s, R²=1.00)" in at_399.evidence
    # The rise stopped at 400 s: a window that is mostly flat no longer fits a leak.
    assert growth[-1] is None
