"""history.py: bounded series at several resolutions."""

from __future__ import annotations

import math
from array import array

import pytest

from gputop.core.history import WEEK_OF_MINUTES, History, Series, _Ring, _WholeRun
from gputop.core.model import DriverInfo, GpuSample, HostSample, ProcSample, Snapshot


def test_raw_window_keeps_the_last_points_in_order():
    s = Series(raw_capacity=100)
    for i in range(250):
        s.append(float(i), float(i))
    t, v = s.window(30)
    assert list(t) == [float(i) for i in range(219, 250)]
    assert list(v) == list(t)
    assert s.latest() == 249.0


def test_long_windows_fall_back_to_coarser_tiers():
    s = Series(raw_capacity=60)
    for i in range(3 * 3600):  # three hours at 1 s
        s.append(float(i), 50.0 + (i % 2))
    t, v = s.window(3600)  # more than raw holds: minute means
    assert 55 <= len(t) <= 61
    assert all(x == pytest.approx(50.5) for x in v)
    t_all, _ = s.window(None)  # the whole run
    assert t_all[0] < 120 and t_all[-1] > 3 * 3600 - 120


def test_whole_run_tier_stays_bounded_and_covers_everything():
    s = Series(raw_capacity=10, whole_capacity=64)
    for i in range(0, 30 * 24 * 3600, 30):  # 30 days at 30 s
        s.append(float(i), 1.0)
    t, v = s.window(None)
    assert len(t) <= 65
    assert t[0] < 2 * 24 * 3600  # the beginning is still there
    assert all(x == pytest.approx(1.0) for x in v)


def test_missing_values_are_nan_not_zero():
    s = Series(raw_capacity=10)
    s.append(0.0, None)
    s.append(1.0, 5.0)
    _, v = s.window(None)
    assert math.isnan(v[0]) and v[1] == 5.0


def _snap(t: float, util: float, pids=(1,)) -> Snapshot:
    procs = tuple(ProcSample(pid=p, name="x", cpu_percent=10.0) for p in pids)
    gpu = GpuSample(index=0, util_gpu=util, mem_used=1, mem_total=2, processes=procs)
    return Snapshot(t, HostSample("h", cpu_percent=1.0), DriverInfo(True), (gpu,))


def test_history_memory_grows_with_what_it_holds_and_stops_at_its_bound():
    """No numpy zeros ahead of time (touched memory): the rings grow by append, 12 bytes a
    point, and stop at their capacity."""
    h = History(raw_capacity=100)
    h.record(_snap(0.0, 1.0))
    first = h.nbytes()
    assert 0 < first < 1000  # one point per tier, not a week of zeros
    for i in range(1, 5000):
        h.record(_snap(float(i), float(i % 100)))
    series = h.gpus[0]["util_gpu"]
    assert series.raw.nbytes() == 100 * 12  # full: it overwrites from here on
    points = len(series.raw.t) + len(series.minute.t) + len(series.whole.t)
    assert series.nbytes() == points * 12
    full_raw = series.raw.nbytes()
    for i in range(5000, 6000):
        h.record(_snap(float(i), 1.0))
    assert series.raw.nbytes() == full_raw
    n_series = sum(len(f) for f in h.gpus.values()) + len(h.host) + 3 * len(h.processes)
    assert h.nbytes() <= n_series * (100 + WEEK_OF_MINUTES + 1024) * 12  # the stated bound
    t, v = h.gpu_window(0, "util_gpu", 10)
    assert len(t) == 11 and v[-1] == 1.0
    assert h.gpu_window(7, "util_gpu", 10) == (array("d"), array("f"))  # never seen


def test_ring_grows_then_wraps_keeping_time_order():
    ring = _Ring(5)
    assert ring.ordered() == (array("d"), array("f")) and ring.oldest_time() is None
    for i in range(3):
        ring.append(float(i), i * 10.0)
    assert (list(ring.t), ring.size, ring.oldest_time(), ring.last_value()) == (
        [0.0, 1.0, 2.0], 3, 0.0, 20.0)
    for i in range(3, 12):
        ring.append(float(i), i * 10.0)
    t, v = ring.ordered()
    assert list(t) == [7.0, 8.0, 9.0, 10.0, 11.0] and list(v) == [70.0, 80, 90, 100, 110]
    assert len(ring.t) == 5 and ring.oldest_time() == 7.0 and ring.last_value() == 110.0
    t.append(99.0)  # a copy: the ring is untouched
    assert ring.ordered()[0][-1] == 11.0


def test_window_after_a_wrap_and_with_missing_values():
    s = Series(raw_capacity=8)
    for i in range(20):
        s.append(float(i), None if i % 3 == 0 else float(i))
    t, v = s.window(5)
    assert list(t) == [14.0, 15.0, 16.0, 17.0, 18.0, 19.0]
    assert [None if math.isnan(x) else x for x in v] == [14.0, None, 16.0, 17.0, None, 19.0]
    assert s.latest() == 19.0
    s.append(20.0, None)
    assert s.latest() is None  # the last sample is missing


def test_whole_run_merges_pairs_and_doubles_its_width_when_full():
    whole = _WholeRun(4, 1.0)
    for i in range(9):  # buckets of 1 s: 8 finished points, the 9th pending
        whole.add(float(i), float(i))
    t, v = whole.ordered()
    # 4 points filled it; the 5th merged pairs and doubled the width to 2 s; the last
    # bucket (8-10 s) is pending, shown. The figures are numpy's (the tier before issue 40).
    assert whole.bucketing.width == 2.0 and len(whole.t) == 4
    assert (list(t), list(v)) == ([1.0, 3.0, 4.5, 7.0, 9.0], [0.5, 2.5, 4.0, 6.5, 8.0])
    whole = _WholeRun(4, 1.0)
    for i in range(40):
        whole.add(i * 0.7, i * 1.3)
    t, v = whole.ordered()
    assert whole.bucketing.width == 8.0 and list(t) == [3.875, 9.5, 14.0, 20.0, 28.0]
    assert list(v) == pytest.approx([7.15, 19.175, 26.0, 37.7, 48.1], rel=1e-6)


def test_process_series_are_evicted_and_capped():
    h = History(raw_capacity=50, max_process_series=3)
    h.record(_snap(0.0, 1.0, pids=(1, 2, 3, 4)))
    assert set(h.processes) == {1, 2, 3}  # capped
    h.record(_snap(History.PROCESS_TTL + 1, 1.0, pids=(9,)))
    assert set(h.processes) == {9}  # the old ones expired, the new one took a slot


def test_every_charted_field_is_kept():
    """The history keeps only the GPU series something draws: each chart's field is one."""
    from gputop.core.history import GPU_FIELDS
    from gputop.tui.view.frames import CHART_FIELDS

    assert set(CHART_FIELDS) <= set(GPU_FIELDS)
