"""One thread that reads the fleet from Prometheus every refresh and keeps the latest view.

The refresh follows the server's scrape interval (``status/config``), never faster (and never
faster than --interval). When the server is down, slow or answers in part, the view keeps the
last data with its time (the screen dims it and says its age), one line says why, and the next
try backs off (doubling, up to ``BACKOFF_MAX_S``); the first answer after that recovers. The
event loop never waits on a query: it reads ``state()``, an immutable snapshot.
"""

from __future__ import annotations

import ctypes
import gc
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from gputop.fleet.prometheus import dcgm_names
from gputop.fleet.prometheus.client import PromClient, PromError
from gputop.fleet.prometheus.diagnose import NodeDiagnosis
from gputop.fleet.prometheus.jobs import JobView, NodeView, build_jobs, build_nodes
from gputop.fleet.prometheus.sources import Filters, fetch

# A node's charts: utilization (%) and memory used (bytes), from either exporter.
CHARTS = {"util_gpu": "gputop_gpu_utilization_percent", "mem_used": "gputop_gpu_memory_used_bytes"}

WARMUP_S = 120.0  # history read at start: the hang rule's minute and the rules' windows
CATCH_UP_MAX_S = 600.0  # after an outage, at most this much history is read back
BACKOFF_MAX_S = 60.0
DEFAULT_SCRAPE_S = 15.0
MIN_SCRAPE_S = 1.0


M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter
MMAP_THRESHOLD = 128 * 1024  # glibc's initial value


def map_large_blocks() -> None:
    """Keep glibc's mmap threshold at its initial 128 KiB. glibc raises it each time a large
    block is freed (up to 32 MiB); after that a refresh's answer bodies and columns come from
    the heap, and their pages stay with the process between refreshes. Mapped, they go back
    to the system when freed: 1,000 dcgm nodes' RSS 108 -> 94 MB after five refreshes. A
    no-op where there is no mallopt (not glibc)."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)


@dataclass(frozen=True)
class FleetState:
    ok: bool  # the last try answered
    error: str | None  # why not (one line)
    data_time: float | None  # when the data shown was read (wall clock)
    retry_at: float | None  # monotonic time of the next try while down
    refresh_s: float
    nodes: dict[str, NodeView] = field(default_factory=dict)
    jobs: list[JobView] = field(default_factory=list)
    queries: int = 0  # of the last refresh
    bytes: int = 0
    refresh_wall_s: float = 0.0
    refresh_cpu_s: float = 0.0
    refreshes: int = 0


class PromFleetMonitor:
    def __init__(self, client: PromClient, filters: Filters | None = None,
                 interval: float = 1.0, on_change: Callable[[], None] | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        map_large_blocks()
        self.client = client
        self.clock = clock  # wall time of "now" (a benchmark replays a stored day)
        self.filters = filters or Filters()
        self.interval = interval
        self.on_change = on_change
        self.diagnoses: dict[str, NodeDiagnosis] = {}
        self._state = FleetState(False, None, None, None, max(interval, DEFAULT_SCRAPE_S))
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_end: float | None = None
        self._scrape_s: float | None = None
        self._failures = 0
        self._lock = threading.Lock()
        self.charts: dict[str, dict[int, dict[str, list[tuple[float, float]]]]] = {}
        self._chart_wanted: str | None = None

    # -- the thread --------------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="gputop-prometheus", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None and timeout > 0:
            self._thread.join(timeout)

    def state(self) -> FleetState:
        return self._state

    def want_chart(self, instance: str) -> None:
        """Ask for a node's charts (query_range), read on the monitor's thread."""
        self._chart_wanted = instance
        self._wake.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            wait = self.refresh_once()
            deadline = time.monotonic() + wait
            while not self._stop.is_set():
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._wake.wait(left)
                self._wake.clear()
                if self._chart_wanted is not None:
                    self._read_chart(self._chart_wanted)
                    self._chart_wanted = None
                    self._notify()

    def refresh_once(self) -> float:
        """One refresh; returns the seconds to wait before the next one."""
        try:
            if self._scrape_s is None:
                # At least a second: the range queries' grid follows it.
                self._scrape_s = max(MIN_SCRAPE_S,
                                     self.client.scrape_interval() or DEFAULT_SCRAPE_S)
            refresh = max(self._scrape_s, self.interval)
            state = self._refresh(self._scrape_s, refresh)
        except PromError as exc:
            self._failures += 1
            backoff = min(BACKOFF_MAX_S, max(self.interval, 1.0) * 2 ** min(self._failures, 6))
            old = self._state
            self._state = FleetState(False, str(exc), old.data_time, time.monotonic() + backoff,
                                     old.refresh_s, old.nodes, old.jobs, old.queries, old.bytes,
                                     old.refresh_wall_s, old.refresh_cpu_s, old.refreshes)
            self._notify()
            return backoff
        self._failures = 0
        self._state = state
        self._notify()
        return state.refresh_s

    def _refresh(self, scrape_s: float, refresh: float) -> FleetState:
        wall0, cpu0 = time.monotonic(), time.process_time()
        now = self.clock()
        end = math.floor(now / scrape_s) * scrape_s
        if self._last_end is None:
            start = end - max(WARMUP_S, 3 * scrape_s)
        else:
            start = max(self._last_end + scrape_s, end - CATCH_UP_MAX_S)
            start = min(start, end)
        # No cyclic collection while a refresh makes ~10 objects per GPU and field: the
        # collector would walk every window kept, again and again (its cost grew with the
        # fleet's square); what a refresh leaves is collected once it is done.
        collecting = gc.isenabled()
        gc.disable()
        try:
            return self._read(now, end, start, scrape_s, refresh, wall0, cpu0)
        finally:
            if collecting:
                gc.enable()

    def _read(self, now: float, end: float, start: float, scrape_s: float, refresh: float,
              wall0: float, cpu0: float) -> FleetState:
        data = fetch(self.client, start, end, scrape_s, self.filters)
        self._last_end = end
        by_node: dict[str, tuple[dict, dict]] = {}
        for key, ref in data.gpus.items():
            if ref.source != "dcgm":
                continue
            refs, rows = by_node.setdefault(ref.instance, ({}, {}))
            refs[key[1]] = ref
            rows[key[1]] = data.series.rows.get(key)
        for instance, (refs, rows) in by_node.items():
            diag = self.diagnoses.get(instance)
            if diag is None:
                host = next(iter(refs.values())).host or instance
                diag = self.diagnoses[instance] = NodeDiagnosis(instance, host)
            diag.feed(refs, rows, data.series)
        for gone in [i for i in self.diagnoses if i not in by_node]:
            del self.diagnoses[gone]
        nodes = build_nodes(data, self.diagnoses)
        jobs = build_jobs(nodes)
        return FleetState(True, None, now, None, refresh, nodes, jobs, data.queries,
                          data.bytes, time.monotonic() - wall0, time.process_time() - cpu0,
                          self._state.refreshes + 1)

    def _read_chart(self, instance: str) -> None:
        """Utilization and memory of a node's GPUs over the last 30 minutes."""
        from gputop.fleet.prometheus.client import quote

        sel = "{" + f"instance={quote(instance)}, " + self.filters.selector()[1:]
        end = self.clock()
        start = end - 1800
        step = max(self._scrape_s or DEFAULT_SCRAPE_S, (end - start) / 240)
        out: dict[int, dict[str, list[tuple[float, float]]]] = {}
        try:
            for name, own in CHARTS.items():
                expr = (f"max by (gpu) ({dcgm_names.field_query(name, sel)}) or "
                        f"max by (gpu) ({own}{sel})")
                for item in self.client.query_range(expr, start, end, step,
                                                    what=f"the {name} chart query"):
                    try:
                        gpu = int(item["metric"]["gpu"])
                        points = [(float(t), float(v)) for t, v in item["values"]]
                    except (KeyError, TypeError, ValueError):
                        continue
                    out.setdefault(gpu, {})[name] = points
        except PromError:
            return
        self.charts[instance] = out

    def _notify(self) -> None:
        if self.on_change is not None:
            self.on_change()
