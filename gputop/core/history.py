"""Bounded time series of snapshots at several resolutions.

Each series keeps three tiers in stdlib ``array`` rings (no numpy: the live monitor loads none)
that grow by appending up to their capacity and then overwrite their oldest point:

* ``raw``: every sample, the last ``raw_capacity`` of them (1 h at a 1 s interval);
* ``minute``: 60 s means for 7 days;
* ``whole``: the whole run in at most ``whole_capacity`` points; when full, neighbouring
  points are merged and the bucket width doubles, so a run of any length fits.

Bound: a point costs 12 bytes (an 8-byte time, a 4-byte value), so a full series costs at most
(3600 + 10080 + 1024) x 12 bytes = 176 KiB, plus the arrays' over-allocation while they grow
(an eighth at most); a series holds only what it has seen (an hour's run: about 45 KiB). A GPU
has 4 series (``GPU_FIELDS``), the host 3, a training process 3 (at most 132 KiB each, smaller
raw tier); process series expire 10 minutes after the process and are capped at
``max_process_series`` (64). With 8 GPUs that is at most (8 x 4 + 3) x 176 + 64 x 3 x 132 KiB
= 31 MiB (x 1.125 while growing), reached after a week; it never grows beyond that.
"""

from __future__ import annotations

import math
from array import array
from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass

from gputop.core.model import ProcSample, Snapshot

# The GPU series the monitor draws (the cards' and rows' charts; frames.CHART_FIELDS): a
# series costs three tiers of appends a tick per GPU, so what nothing draws is not kept.
GPU_FIELDS = ("util_gpu", "mem_used", "power_w", "pcie_rx_mbs")
HOST_FIELDS = ("cpu_percent", "memory_used", "iowait")

MINUTE = 60.0
WEEK_OF_MINUTES = 7 * 24 * 60


def _nbytes(t: array, v: array) -> int:
    """Bytes of a tier's points (its times and values)."""
    return len(t) * t.itemsize + len(v) * v.itemsize


class _Ring:
    """A ring of (time, value) points: grows by append up to ``capacity`` (an array of zeros
    allocated ahead would be memory touched for nothing), then overwrites the oldest."""

    __slots__ = ("t", "v", "capacity", "head")

    def __init__(self, capacity: int) -> None:
        self.t = array("d")
        self.v = array("f")  # float32, as the charts need
        self.capacity = capacity
        self.head = 0  # next write position once full

    @property
    def size(self) -> int:
        return len(self.t)

    def append(self, t: float, v: float) -> None:
        if len(self.t) < self.capacity:
            self.t.append(t)
            self.v.append(v)
            return
        self.t[self.head] = t
        self.v[self.head] = v
        self.head = (self.head + 1) % self.capacity

    def ordered(self) -> tuple[array, array]:
        """Copies of the times and values, oldest first."""
        if len(self.t) < self.capacity or self.head == 0:
            return self.t[:], self.v[:]
        h = self.head
        return self.t[h:] + self.t[:h], self.v[h:] + self.v[:h]

    def oldest_time(self) -> float | None:
        if not self.t:
            return None
        return self.t[self.head if len(self.t) == self.capacity else 0]

    def last_value(self) -> float | None:
        if not self.v:
            return None
        return self.v[(self.head - 1) % self.capacity if len(self.v) == self.capacity else -1]

    def nbytes(self) -> int:
        return _nbytes(self.t, self.v)


class _Bucketing:
    """Averages incoming points into buckets of ``width`` seconds before they are stored."""

    def __init__(self, width: float) -> None:
        self.width = width
        self.bucket: float | None = None
        self.total = 0.0
        self.count = 0

    def add(self, t: float, v: float) -> tuple[float, float] | None:
        """Add a point; return the finished (time, mean) of the previous bucket, if any."""
        bucket = math.floor(t / self.width)
        done = None
        if self.bucket is not None and bucket != self.bucket and self.count:
            done = ((self.bucket + 0.5) * self.width, self.total / self.count)
            self.total, self.count = 0.0, 0
        self.bucket = bucket
        if not math.isnan(v):
            self.total += v
            self.count += 1
        return done

    def pending(self) -> tuple[float, float] | None:
        if self.bucket is None or not self.count:
            return None
        return ((self.bucket + 0.5) * self.width, self.total / self.count)


class _WholeRun:
    """The whole run in at most ``capacity`` points: merge pairs and double the width when full."""

    def __init__(self, capacity: int, width: float) -> None:
        self.t = array("d")
        self.v = array("f")
        self.capacity = capacity
        self.bucketing = _Bucketing(width)

    def add(self, t: float, v: float) -> None:
        done = self.bucketing.add(t, v)
        if done is None:
            return
        if len(self.t) == self.capacity:
            ts, vs = self.t, self.v
            self.t = array("d", [(a + b) / 2 for a, b in zip(ts[0::2], ts[1::2])])
            self.v = array("f", [(a + b) / 2 for a, b in zip(vs[0::2], vs[1::2])])
            self.bucketing = _Bucketing(self.bucketing.width * 2)
        self.t.append(done[0])
        self.v.append(done[1])

    def ordered(self) -> tuple[array, array]:
        t, v = self.t[:], self.v[:]
        pending = self.bucketing.pending()
        if pending is not None:
            t.append(pending[0])
            v.append(pending[1])
        return t, v

    def nbytes(self) -> int:
        return _nbytes(self.t, self.v)


class Series:
    """One metric over time, at raw, minute and whole-run resolution."""

    def __init__(self, raw_capacity: int = 3600, whole_capacity: int = 1024) -> None:
        self.raw = _Ring(raw_capacity)
        self.minute = _Ring(WEEK_OF_MINUTES)
        self._minute_bucketing = _Bucketing(MINUTE)
        self.whole = _WholeRun(whole_capacity, MINUTE / 4)
        self.first_time: float | None = None
        self.last_time: float | None = None

    def append(self, t: float, value: float | None) -> None:
        v = math.nan if value is None else float(value)
        if self.first_time is None:
            self.first_time = t
        self.last_time = t
        self.raw.append(t, v)
        done = self._minute_bucketing.add(t, v)
        if done is not None:
            self.minute.append(*done)
        self.whole.add(t, v)

    def window(self, seconds: float | None) -> tuple[Sequence[float], Sequence[float]]:
        """Points of the last ``seconds`` (None: the whole run), from the finest tier covering
        it: two new arrays (times, values; NaN where a value was missing), oldest first."""
        if self.last_time is None or self.first_time is None:
            return array("d"), array("f")
        start = self.first_time if seconds is None else self.last_time - seconds
        oldest_raw = self.raw.oldest_time()
        if oldest_raw is not None and (oldest_raw <= start or oldest_raw == self.first_time):
            t, v = self.raw.ordered()
        elif seconds is not None and (self.minute.oldest_time() or math.inf) <= start:
            t, v = self.minute.ordered()
        else:
            t, v = self.whole.ordered()
        first = bisect_left(t, start)  # the times are in order
        if first:
            del t[:first], v[:first]
        return t, v

    def nbytes(self) -> int:
        return self.raw.nbytes() + self.minute.nbytes() + self.whole.nbytes()

    def latest(self) -> float | None:
        value = self.raw.last_value()
        return None if value is None or math.isnan(value) else value


@dataclass
class _ProcessSeries:
    cpu: Series
    workers_cpu: Series
    gpu_mem: Series
    gpu_sm: Series  # the process's own SM share (NVML's per-process utilization)
    last_seen: float


class History:
    """All series of a session, fed one snapshot at a time on the sampling side."""

    PROCESS_TTL = 600.0

    def __init__(self, raw_capacity: int = 3600, max_process_series: int = 64) -> None:
        self.raw_capacity = raw_capacity
        self.max_process_series = max_process_series
        self.gpus: dict[int, dict[str, Series]] = {}
        self.host: dict[str, Series] = {f: Series(raw_capacity) for f in HOST_FIELDS}
        self.processes: dict[int, _ProcessSeries] = {}
        self.latest: Snapshot | None = None
        self.samples = 0

    def record(self, snap: Snapshot) -> None:
        t = snap.time
        self.latest = snap
        self.samples += 1
        self._evict(t)  # first, so a new process can take an expired one's slot
        for name in HOST_FIELDS:
            self.host[name].append(t, getattr(snap.host, name))
        for gpu in snap.gpus:
            series = self.gpus.get(gpu.index)
            if series is None:
                series = self.gpus[gpu.index] = {f: Series(self.raw_capacity) for f in GPU_FIELDS}
            for name in GPU_FIELDS:
                series[name].append(t, None if gpu.lost else getattr(gpu, name))
            for proc in gpu.processes:
                self._record_process(t, proc.pid, proc.cpu_percent, proc, gpu_mem=proc.gpu_mem)
        for proc in snap.other_processes:
            self._record_process(t, proc.pid, proc.cpu_percent, proc, gpu_mem=None)

    def _record_process(self, t: float, pid: int, cpu: float | None, proc: ProcSample,
                        gpu_mem: int | None) -> None:
        entry = self.processes.get(pid)
        if entry is None:
            if len(self.processes) >= self.max_process_series:
                return
            cap = min(self.raw_capacity, 900)
            entry = self.processes[pid] = _ProcessSeries(
                Series(cap, 256), Series(cap, 256), Series(cap, 256), Series(cap, 256), t
            )
        if entry.last_seen == t and entry.cpu.last_time == t:
            return  # a process on several GPUs: record it once per snapshot
        entry.last_seen = t
        entry.cpu.append(t, cpu)
        entry.workers_cpu.append(t, sum(w.cpu_percent or 0.0 for w in proc.workers))
        entry.gpu_mem.append(t, gpu_mem)
        entry.gpu_sm.append(t, proc.sm_util if gpu_mem is not None else None)

    def _evict(self, now: float) -> None:
        gone = [pid for pid, e in self.processes.items() if now - e.last_seen > self.PROCESS_TTL]
        for pid in gone:
            del self.processes[pid]

    def nbytes(self) -> int:
        """Bytes of points held by all series: bounded (see the module's docstring)."""
        series = [s for per_gpu in self.gpus.values() for s in per_gpu.values()]
        series += list(self.host.values())
        series += [s for e in self.processes.values()
                   for s in (e.cpu, e.workers_cpu, e.gpu_mem, e.gpu_sm)]
        return sum(s.nbytes() for s in series)

    def gpu_window(self, index: int, name: str, seconds: float | None
                   ) -> tuple[Sequence[float], Sequence[float]]:
        series = self.gpus.get(index, {}).get(name)
        if series is None:
            return array("d"), array("f")
        return series.window(seconds)
