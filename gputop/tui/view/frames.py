"""What the sampling thread hands to the UI: an immutable frame of one snapshot plus the chart
series for the chosen window, already cut out of the history, and the active findings.

Cutting the windows and running the live rules on the sampling thread keeps every History read
on the thread that writes it, so the UI never sees a ring half-updated, and the event loop only
draws.
"""

from __future__ import annotations

import threading
import time
from bisect import bisect_right
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING

from gputop.core.model import Snapshot
from gputop.diagnostics.findings import Finding

if TYPE_CHECKING:
    from gputop.core.history import History
    from gputop.diagnostics.live.mig import LiveDiagnosis
    from gputop.stacks.where import WhereFinder

# Chart windows selected with keys 1-4, in seconds; None is the whole run.
WINDOWS: tuple[float | None, ...] = (60.0, 600.0, 3600.0, None)
WINDOW_NAMES = {60.0: "1 min", 600.0: "10 min", 3600.0: "1 h", None: "whole run"}
# The live rules run on the windows every RULES_PERIOD_S of sampling (every tick at an interval
# this long or longer): their windows are 10 s and more, and a finding raises after holding 4 s,
# so a verdict every 2 s loses nothing a reader sees, at half the rules' cost at 1 s.
RULES_PERIOD_S = 2.0
# The GPU fields the cards and compact rows chart.
CHART_FIELDS = ("util_gpu", "mem_used", "power_w", "pcie_rx_mbs")

# (times, values) of one series: arrays of their own (copies cut from the History's rings,
# which nothing writes after), oldest first. The History loads after the first frame: that
# frame is drawn from the first sample alone (``first_frame``).
Points = tuple[Sequence[float], Sequence[float]]


@dataclass(frozen=True)
class ProcessSeries:
    """Charts of one training process for the process view."""

    pid: int
    cpu: Points
    workers_cpu: Points
    gpu_mem: Points
    gpu_sm: Points


@dataclass(frozen=True)
class Frame:
    seq: int
    snapshot: Snapshot
    window: float | None
    start: float  # the charts' time axis
    end: float
    gpu_series: Mapping[int, Mapping[str, Points]]
    process: ProcessSeries | None = None
    findings: tuple[Finding, ...] = ()  # active at ``snapshot``, most costly first


def build_frame(history: History, snapshot: Snapshot, window: float | None, seq: int,
                focus_pid: int | None = None, findings: tuple[Finding, ...] = ()) -> Frame:
    """Cut the chart windows ending at ``snapshot`` out of ``history`` (which may be newer:
    while paused the display stays on the frozen snapshot)."""
    end = snapshot.time

    def cut(series) -> Points:
        t, v = series.window(None if window is None else window + (series.last_time or end) - end)
        keep = bisect_right(t, end)  # the times are in order
        return (t, v) if keep == len(t) else (t[:keep], v[:keep])

    gpu_series = {}
    for gpu in snapshot.gpus:
        fields = history.gpus.get(gpu.index, {})
        gpu_series[gpu.index] = MappingProxyType(
            {name: cut(fields[name]) for name in CHART_FIELDS if name in fields}
        )
    if window is None:
        firsts = [s.first_time for f in history.gpus.values() for s in f.values() if s.first_time]
        start = min(firsts, default=end - 60.0)
        start = min(start, end - 1.0)
    else:
        start = end - window
    process = None
    entry = history.processes.get(focus_pid) if focus_pid is not None else None
    if entry is not None:
        process = ProcessSeries(focus_pid, cut(entry.cpu), cut(entry.workers_cpu),
                                cut(entry.gpu_mem), cut(entry.gpu_sm))
    return Frame(seq, snapshot, window, start, end, MappingProxyType(gpu_series), process,
                 findings)


# How long the sampling thread waits for the first frame to be painted before it goes on.
FIRST_FRAME_WAIT_S = 1.0


def first_frame(snapshot: Snapshot, window: float | None, seq: int) -> Frame:
    """The frame of the first sample, before it is recorded: no chart has a point yet (one
    point draws nothing) and no rule has run, so it needs no history."""
    end = snapshot.time
    return Frame(seq, snapshot, window, end - (window or 1.0), end, MappingProxyType({}))


class FrameLog:
    """Frame times, written off the UI thread (GPUTOP_FRAME_LOG=path): one line per frame with
    the handler's wall time, its CPU time, and the wall time until the frame was on screen
    (layout and paint too), in milliseconds."""

    def __init__(self, path: str | None) -> None:
        self.path = path
        self._pending: list[tuple[float, float, float]] = []
        self._lock = threading.Lock()

    def record(self, handler_ms: float, handler_cpu_ms: float, painted_ms: float) -> None:
        if self.path:
            with self._lock:
                self._pending.append((handler_ms, handler_cpu_ms, painted_ms))

    def flush(self) -> None:
        if not self.path:
            return
        with self._lock:
            pending, self._pending = self._pending, []
        if pending:
            with open(self.path, "a", encoding="utf-8") as out:
                out.write("".join(f"{h:.3f} {c:.3f} {p:.3f}\n" for h, c, p in pending))


class Feed:
    """The frame source the app talks to: what window to cut, which process to follow,
    whether the display is frozen. Subclasses deliver frames by calling ``post``.

    With ``diagnose`` every recorded snapshot also goes through the live rules, and each frame
    carries the findings active at its snapshot."""

    def __init__(self, post: Callable[[Frame], None], diagnose: bool = True,
                 where: WhereFinder | None = None,
                 make_where: Callable[[], WhereFinder | None] | None = None,
                 where_ids: Collection[str] = ()) -> None:
        """``make_where``: makes ``where`` at the first finding in ``where_ids``; it brings in
        the stacks modules (~0.3 MiB), which a monitor without such a finding never loads."""
        self.post = post
        self._make_where = make_where
        self._where_ids = frozenset(where_ids)
        self._history: History | None = None
        self._history_lock = threading.Lock()
        self.diagnose = diagnose
        self.diagnosis: LiveDiagnosis | None = None  # made with the history
        self.where = where  # fills in the findings' "where" line (py-spy, its own thread)
        # The memory findings' "where", from this session's memory captures (`m`): made by
        # the app at the first one (memory.where.MemoryWhere).
        self.memory_where = None
        self.findings: tuple[Finding, ...] = ()
        self.window: float | None = WINDOWS[0]
        self.focus_pid: int | None = None
        self.paused = False
        self.latest_seq = 0  # the newest frame posted; older ones are stale on arrival
        self._frozen: tuple[Snapshot, tuple[Finding, ...]] | None = None
        self.rules_every = 1  # run the rules on every n-th recorded snapshot
        self._recorded = 0

    @property
    def history(self) -> History:
        """Made on first use (it loads the history module): after the first frame is posted."""
        if self._history is None:
            with self._history_lock:
                if self._history is None:
                    from gputop.core.history import History

                    if self.diagnose:
                        from gputop.diagnostics.live.mig import LiveDiagnosis

                        self.diagnosis = LiveDiagnosis()
                    self._history = History()
        return self._history

    def record(self, snap: Snapshot) -> None:
        """Keep ``snap`` in the history and update the findings (on the feed's thread)."""
        self.history.record(snap)
        self._recorded += 1
        if self.diagnosis is not None:
            evaluate = (self._recorded - 1) % self.rules_every == 0
            self.diagnosis.update(snap, evaluate=evaluate)
            if not evaluate:
                return
            findings = tuple(self.diagnosis.findings())
            if self.where is None and self._make_where is not None and any(
                    f.id in self._where_ids and f.pid is not None for f in findings):
                self._start_where()
            if self.where is not None:
                without_agent = {p.pid for g in snap.gpus for p in g.processes if not p.agent}
                self.where.update(findings, without_agent)
                findings = self.where.enrich(findings)
            memory_where = self.memory_where
            if memory_where is not None:
                findings = memory_where.enrich(findings, snap)
            # What costs this host's GPUs first, the user's own before others'.
            from gputop.diagnostics.live.ranking import rank_for_host

            self.findings = tuple(rank_for_host(findings, snap))

    def _start_where(self) -> None:
        with self._history_lock:  # not while ``stop`` closes it
            make, self._make_where = self._make_where, None  # one try (py-spy may be missing)
            if make is not None:
                self.where = make()

    def _emit(self) -> None:
        if self.paused and self._frozen:
            snap, findings = self._frozen
        else:
            snap, findings = self.history.latest, self.findings
        if snap is None:
            return
        self.latest_seq += 1
        self.post(build_frame(self.history, snap, self.window, self.latest_seq, self.focus_pid,
                              findings))

    def set_paused(self, paused: bool) -> None:
        latest = self.history.latest
        self._frozen = (latest, self.findings) if paused and latest is not None else None
        self.paused = paused
        self.request_frame()

    def request_frame(self) -> None:
        """Post a frame now (after a window, focus or pause change)."""
        raise NotImplementedError


class FixedFeed(Feed):
    """A fixed sequence of snapshots, recorded up front: for tests and screenshots."""

    def __init__(self, post: Callable[[Frame], None], snapshots: Sequence[Snapshot],
                 diagnose: bool = False) -> None:
        super().__init__(post, diagnose)
        for snap in snapshots:
            self.record(snap)

    def request_frame(self) -> None:
        self._emit()


class SamplerFeed(Feed):
    """Samples every ``interval`` on the thread that calls ``run`` and posts a frame per tick;
    a request from the UI wakes it to post a frame from the history without sampling."""

    def __init__(self, post: Callable[[Frame], None], interval: float,
                 frame_log: FrameLog | None = None, diagnose: bool = True,
                 where: WhereFinder | None = None,
                 make_where: Callable[[], WhereFinder | None] | None = None,
                 where_ids: Collection[str] = ()) -> None:
        super().__init__(post, diagnose, where, make_where, where_ids)
        self.interval = interval
        self.rules_every = max(1, round(RULES_PERIOD_S / interval)) if interval > 0 else 1
        self.frame_log = frame_log
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._requested = False
        # Set by the app once the first frame is on screen: until then this thread leaves
        # the interpreter to the interface (recording the first sample loads the history).
        self.first_shown = threading.Event()

    def request_frame(self) -> None:
        self._requested = True
        self._wake.set()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        self.first_shown.set()
        with self._history_lock:  # not while the history (and ``where``) is being made
            self._make_where = None
            if self.where is not None:
                self.where.close()

    @property
    def stopped(self) -> bool:
        return self._stop.is_set()

    def run(self, sampler, first: Snapshot | None = None) -> None:
        """The sampling loop; returns when ``stop`` is called. ``first``: a sample already
        taken (gputop top samples while the interface loads)."""
        # The first sample fills the screen at once, before anything else is done with it;
        # CPU rates and charts need a second one, soon after.
        first = first if first is not None else sampler.sample()
        if not self.paused:
            self.latest_seq += 1
            self.post(first_frame(first, self.window, self.latest_seq))
            self.first_shown.wait(FIRST_FRAME_WAIT_S)
        self.record(first)
        del first  # not kept for the whole run
        next_tick = time.monotonic() + min(self.interval, 0.3)
        while not self._stop.is_set():
            delay = next_tick - time.monotonic()
            if delay > 0:
                self._wake.wait(delay)
                self._wake.clear()
                if self._stop.is_set():
                    break
                if self._requested:
                    self._requested = False
                    self._emit()
                    continue
                if time.monotonic() < next_tick:
                    continue
            next_tick = max(next_tick + self.interval, time.monotonic())
            self.record(sampler.sample())
            if not self.paused:
                self._emit()
            if self.frame_log is not None:
                self.frame_log.flush()
        if self.frame_log is not None:
            self.frame_log.flush()
