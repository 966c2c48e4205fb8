"""history.py: bounded series at several resolutions."""

from __future__ import annotations

import math

import numpy as np

from gputop.history import History, Series
from gputop.model import DriverInfo, GpuSample, HostSample, ProcSample, Snapshot


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
    assert np.allclose(v, 50.5)
    t_all, _ = s.window(None)  # the whole run
    assert t_all[0] < 120 and t_all[-1] > 3 * 3600 - 120


def test_whole_run_tier_stays_bounded_and_covers_everything():
    s = Series(raw_capacity=10, whole_capacity=64)
    for i in range(0, 30 * 24 * 3600, 30):  # 30 days at 30 s
        s.append(float(i), 1.0)
    t, v = s.window(None)
    assert len(t) <= 65
    assert t[0] < 2 * 24 * 3600  # the beginning is still there
    assert np.allclose(v, 1.0)


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


def test_history_memory_is_fixed_from_the_first_sample():
    h = History(raw_capacity=100)
    h.record(_snap(0.0, 1.0))
    before = h.nbytes()
    for i in range(1, 5000):
        h.record(_snap(float(i), float(i % 100)))
    assert h.nbytes() == before
    t, v = h.gpu_window(0, "util_gpu", 10)
    assert len(t) == 11 and v[-1] == 4999 % 100


def test_process_series_are_evicted_and_capped():
    h = History(raw_capacity=50, max_process_series=3)
    h.record(_snap(0.0, 1.0, pids=(1, 2, 3, 4)))
    assert set(h.processes) == {1, 2, 3}  # capped
    h.record(_snap(History.PROCESS_TTL + 1, 1.0, pids=(9,)))
    assert set(h.processes) == {9}  # the old ones expired, the new one took a slot


def test_every_charted_field_is_kept():
    """The history keeps only the GPU series something draws: each chart's field is one."""
    from gputop.history import GPU_FIELDS
    from gputop.tui.frames import CHART_FIELDS

    assert set(CHART_FIELDS) <= set(GPU_FIELDS)
