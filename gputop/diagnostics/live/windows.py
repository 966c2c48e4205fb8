"""The windows the live rules read, kept up to date one snapshot at a time.

The snapshots of the last ``WINDOW_S`` seconds, and per GPU the rules' window, the hang window,
the time it last worked and the memory fit, as exact integer running sums that points join and
leave as they expire: a tick costs the same after an hour as in the first minute. A GPU's
windows start when its job's start-up ends (``startup``): start-up samples never reach a rule.
"""

from __future__ import annotations

import math
import os
from array import array
from bisect import bisect_left
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from operator import attrgetter, itemgetter
from types import MappingProxyType
from typing import Any

from gputop.core.model import GpuSample, Snapshot
from gputop.diagnostics.live.common import (
    HUNG_S,
    KEEP_S,
    MEMORY_WINDOW_S,
    MIN_SAMPLES,
    WINDOW_S,
    WORKED_UTIL,
    mean,
)
from gputop.diagnostics.live.hang import RankMemory
from gputop.diagnostics.live.links import Link, gpu_link
from gputop.diagnostics.live.startup import StartUp


def _linear_fit(ts: list[float], ys: list[float]) -> tuple[float, float]:
    """Slope and R^2 of a least-squares line."""
    if len(ts) < 3:
        return 0.0, 0.0
    t0 = ts[0]
    t = [float(x) - t0 for x in ts]  # pure Python: the live monitor loads no numpy
    y = [float(x) for x in ys]
    mt, my = math.fsum(t) / len(t), math.fsum(y) / len(y)
    t = [x - mt for x in t]
    y = [x - my for x in y]
    sxx = math.fsum(a * a for a in t)
    sxy = math.fsum(a * b for a, b in zip(t, y))
    syy = math.fsum(b * b for b in y)
    if sxx == 0:
        return 0.0, 0.0
    return sxy / sxx, (sxy * sxy) / (sxx * syy) if syy > 0 else 0.0


class _RunningFit:
    """Least squares over a sliding window of (time, bytes) points, kept as exact integer sums
    (times in microseconds from the first point) that points join and leave one at a time: the
    fit costs the same whatever the window holds, and removal never accumulates rounding.

    The points sit in two typed arrays (16 bytes a point): a fleet of 10,000 nodes keeps one
    fit per GPU, where tuples of Python numbers cost ten times as much."""

    __slots__ = ("times", "values", "origin", "n", "st", "sy", "stt", "sty", "syy")

    def __init__(self) -> None:
        self.times = array("d")  # seconds
        self.values = array("q")  # bytes
        self.origin: float | None = None
        self.n = self.st = self.sy = self.stt = self.sty = self.syy = 0

    def _us(self, t: float) -> int:
        # The same arithmetic when a point joins and when it leaves: the sums stay exact.
        return round((t - self.origin) * 1e6)  # type: ignore[operator]

    def add(self, t: float, y: int) -> None:
        if self.origin is None:
            self.origin = t
        tu = self._us(t)
        self.times.append(t)
        self.values.append(y)
        self.n += 1
        self.st += tu
        self.sy += y
        self.stt += tu * tu
        self.sty += tu * y
        self.syy += y * y

    def trim(self, oldest: float) -> None:
        """Drop the points before ``oldest``."""
        times, values = self.times, self.values
        drop = 0
        while drop < len(times) and times[drop] < oldest:
            tu, y = self._us(times[drop]), values[drop]
            self.n -= 1
            self.st -= tu
            self.sy -= y
            self.stt -= tu * tu
            self.sty -= tu * y
            self.syy -= y * y
            drop += 1
        if drop:
            del times[:drop]
            del values[:drop]
        if not times:
            self.origin = None

    def __len__(self) -> int:
        return len(self.times)

    def pairs(self) -> list[tuple[float, int]]:
        """The points kept, oldest first, as (time, bytes)."""
        return list(zip(self.times, self.values))

    def fit(self) -> tuple[float, float]:
        """Slope (bytes per second) and R^2, as ``_linear_fit`` gives them."""
        n = self.n
        if n < 3:
            return 0.0, 0.0
        sxx = n * self.stt - self.st * self.st  # n times the centred sums, exactly
        sxy = n * self.sty - self.st * self.sy
        syy = n * self.syy - self.sy * self.sy
        if sxx == 0:
            return 0.0, 0.0
        slope = sxy / sxx * 1e6
        return slope, (sxy / sxx) * (sxy / syy) if syy > 0 else 0.0


def _drop_before(items: list, oldest: float, key: Callable[[Any], float] | None = None) -> None:
    """Drop the entries before ``oldest`` from the front of a list kept in time order (a list,
    not a deque: a deque costs ~760 bytes empty, one per GPU and window)."""
    del items[:bisect_left(items, oldest, key=key)]


_first = itemgetter(0)
_snapshot_time = attrgetter("time")


_NO_STEPS: Mapping[int, object] = MappingProxyType({})


def _steps_by_pid(g: GpuSample) -> Mapping[int, object]:
    """The step count each of the GPU's processes' agents reported in this sample."""
    steps = {p.pid: p.agent.steps for p in g.processes
             if p.agent is not None and p.agent.steps is not None}
    return steps or _NO_STEPS


class _GpuWindows:
    """One GPU's samples since its start-up ended: the rules' window, the hang window, the
    time it last did work, and the memory fit."""

    __slots__ = ("window", "hang", "last_busy", "memory", "since")

    def __init__(self, since: float) -> None:
        self.window: list[tuple[float, GpuSample]] = []  # the last WINDOW_S
        # The last HUNG_S as the agents' step counts by pid (all the hung rule reads of it),
        # of the samples that have any: a minute of whole samples, processes and agent
        # replies included, was most of the monitor's memory growth.
        self.hang: list[tuple[float, Mapping[int, object]]] = []
        self.last_busy: float | None = None  # the last sample with GPU work (util >= 1 %)
        self.memory = _RunningFit()  # mem_used over the last MEMORY_WINDOW_S
        self.since = since  # the first sample after start-up

    def add(self, t: float, g: GpuSample) -> None:
        self.window.append((t, g))
        steps = _steps_by_pid(g)
        if steps is not _NO_STEPS:  # the hung rule reads reported steps only
            self.hang.append((t, steps))
        if (g.util_gpu or 0) >= WORKED_UTIL:
            self.last_busy = t
        if g.mem_used is not None:
            self.memory.add(t, int(g.mem_used))

    def trim(self, now: float) -> None:
        _drop_before(self.window, now - WINDOW_S, _first)
        _drop_before(self.hang, now - HUNG_S, _first)
        self.memory.trim(now - MEMORY_WINDOW_S)


class _Windows:
    """What the rules read, updated per snapshot at a cost that does not grow with the
    history kept: the snapshots of the last WINDOW_S, per-GPU windows, and how far back the
    history goes (KEEP_S at most)."""

    def __init__(self) -> None:
        self.snapshots: list[Snapshot] = []  # the last WINDOW_S
        self.times: list[float] = []  # every snapshot kept (KEEP_S)
        self.gpus: dict[int, _GpuWindows] = {}  # in the order the GPUs were first seen
        self.startup = StartUp()
        self.starting: set[int] = set()  # GPUs of the newest snapshot in a job's start-up
        self.ranks = RankMemory()  # every job's local ranks seen: the hang rule names the gone

    def add(self, snap: Snapshot) -> None:
        now = snap.time
        self.snapshots.append(snap)
        self.times.append(now)
        self.starting = self.startup.update(snap)
        self.ranks.update(snap)
        for g in snap.gpus:
            if g.index in self.starting:
                self.gpus.pop(g.index, None)  # its windows begin after the start-up
                continue
            state = self.gpus.get(g.index)
            if state is None:
                state = self.gpus[g.index] = _GpuWindows(now)
            state.add(now, g)
        _drop_before(self.snapshots, now - WINDOW_S, _snapshot_time)
        _drop_before(self.times, now - KEEP_S)
        for state in self.gpus.values():
            state.trim(now)

    def context(self, own_pid: int | None) -> _Context | None:
        """The rules' view of the newest snapshot, or None while the window is too short."""
        if len(self.snapshots) < MIN_SAMPLES:
            return None
        newest = self.snapshots[-1]
        current = {g.index for g in newest.gpus}
        return _Context(
            window=list(self.snapshots),
            own_pid=own_pid or os.getpid(),
            now=newest.time,
            span=newest.time - self.times[0],
            gpus={i: s for i, s in self.gpus.items()
                  if i in current and len(s.window) >= MIN_SAMPLES},
            ranks=self.ranks,
        )


@dataclass(frozen=True)
class GpuReadings:
    """A GPU's means over the window, read by several rules."""

    util: float | None  # NVML utilization, %: a kernel or a copy ran
    sm: float | None  # GPM SM activity, %: SM-cycles with a warp resident (None: no GPM)
    rx: float  # PCIe MB/s, host to device
    tx: float  # device to host
    link: Link | None

    @property
    def idle(self) -> float:
        """Share of the time the GPU had nothing to do (0 when utilization is unknown)."""
        return 0.0 if self.util is None else max(0.0, 1.0 - self.util / 100.0)

    @property
    def bus(self) -> float | None:
        """The busier direction's traffic as a share of the link's capacity: the least share
        of the time the link spent moving data."""
        if self.link is None:
            return None
        return max(self.rx, self.tx) / self.link.capacity_mbs

    @property
    def kernels(self) -> float | None:
        """The least share of the time kernels ran: utilization counts copies too, so the
        link's busy share comes off it."""
        if self.util is None:
            return None
        return max(0.0, self.util / 100.0 - (self.bus or 0.0))


@dataclass
class _Context:
    window: list[Snapshot]  # the last WINDOW_S seconds
    own_pid: int
    now: float  # the newest snapshot's time
    span: float  # how far back the history kept goes (up to KEEP_S)
    gpus: dict[int, _GpuWindows]  # the GPUs of the newest snapshot, past their start-up
    _per_gpu: list[tuple[int, list[GpuSample]]] | None = None
    _host_cpu: float | None = None
    _readings: dict[int, GpuReadings] = field(default_factory=dict)
    loads: dict = field(default_factory=dict)  # (GPU, pid) -> load.TreeLoad
    ranks: RankMemory | None = None  # the jobs' local ranks seen so far (the hang rule)

    def host_cpu(self) -> float:
        """The host's mean CPU % over the window (0 when unknown)."""
        if self._host_cpu is None:
            self._host_cpu = mean(s.host.cpu_percent for s in self.window) or 0.0
        return self._host_cpu

    def per_gpu(self) -> list[tuple[int, list[GpuSample]]]:
        """(index, samples of the last WINDOW_S) of every GPU of the newest snapshot."""
        if self._per_gpu is None:
            self._per_gpu = [(i, [g for _, g in s.window]) for i, s in self.gpus.items()]
        return self._per_gpu

    def readings(self, index: int, gpus: list[GpuSample]) -> GpuReadings:
        found = self._readings.get(index)
        if found is None:
            found = self._readings[index] = GpuReadings(
                util=mean(g.util_gpu for g in gpus),
                sm=mean(g.sm_active for g in gpus),
                rx=mean(g.pcie_rx_mbs for g in gpus) or 0.0,
                tx=mean(g.pcie_tx_mbs for g in gpus) or 0.0,
                link=gpu_link(gpus),
            )
        return found
