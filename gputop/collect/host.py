"""Host and training-process sampling through psutil.

CPU percentages are rates between two calls, so psutil.Process objects are kept across ticks
(keyed by pid and create time, so a reused pid is not mistaken for the old process). A process
seen for the first time has ``cpu_percent=None`` until the next tick measures it, or, with
``lifetime_first=True`` (one-shot commands that do not wait a second tick), the share of a core
it has used since it started, from the counters already in /proc (what `ps` shows).
"""

from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass

import psutil

from gputop.model import HostSample, ProcSample, WorkerSample

_ATTRS = ["name", "ppid", "username", "status", "num_threads", "memory_info", "create_time", "cmdline"]


@dataclass
class _Tracked:
    proc: psutil.Process
    create_time: float
    measured: bool = False  # cpu_percent has a previous call to measure against


def _ppid_map() -> dict[int, int]:
    """pid -> parent pid for every process: one pass over /proc (O(all processes))."""
    try:
        from psutil._pslinux import ppid_map  # the fast path psutil itself uses on Linux

        return ppid_map()
    except (ImportError, OSError, AttributeError):
        return {p.pid: p.info["ppid"] for p in psutil.process_iter(["ppid"])}


class HostCollector:
    # Finding children needs a scan of every process; workers come and go at epoch
    # boundaries, not every second, so the scan is reused for this long.
    CHILDREN_REFRESH_S = 2.0

    def __init__(self, lifetime_first: bool = False) -> None:
        self.hostname = socket.gethostname()
        self.lifetime_first = lifetime_first
        self._tracked: dict[int, _Tracked] = {}
        self._seen: set[int] = set()
        self._children: dict[int, list[int]] = {}
        self._known: set[int] = set()  # pids that existed at the last scan
        self._children_at = -1e9
        self._last_io: tuple[float, object, dict] | None = None
        # Prime the rate counters so the first sample() has a baseline.
        psutil.cpu_percent(percpu=True)
        psutil.cpu_times_percent()
        self._io_counters()

    # -- host ---------------------------------------------------------------------------------

    @staticmethod
    def _net_counters() -> dict:
        try:
            return {k: v for k, v in psutil.net_io_counters(pernic=True).items() if k != "lo"}
        except (OSError, RuntimeError):
            return {}

    def _io_counters(self) -> tuple[float | None, float | None, float | None, float | None]:
        """Disk read/write and network rx/tx in bytes per second since the last call."""
        now = time.monotonic()
        try:
            disk = psutil.disk_io_counters()
        except (OSError, RuntimeError):
            disk = None
        net = self._net_counters()
        rates: tuple[float | None, float | None, float | None, float | None] = (None,) * 4
        if self._last_io is not None:
            then, last_disk, last_net = self._last_io
            dt = max(now - then, 1e-6)
            d_read = d_write = None
            if disk is not None and last_disk is not None:
                d_read = max(0, disk.read_bytes - last_disk.read_bytes) / dt
                d_write = max(0, disk.write_bytes - last_disk.write_bytes) / dt
            rx = sum(max(0, c.bytes_recv - last_net[k].bytes_recv) for k, c in net.items() if k in last_net)
            tx = sum(max(0, c.bytes_sent - last_net[k].bytes_sent) for k, c in net.items() if k in last_net)
            rates = (d_read, d_write, rx / dt, tx / dt)
        self._last_io = (now, disk, net)
        return rates

    def sample_host(self) -> HostSample:
        per_core = tuple(psutil.cpu_percent(percpu=True))
        times = psutil.cpu_times_percent()
        mem = psutil.virtual_memory()
        swap = psutil.swap_memory()
        load = os.getloadavg()
        disk_r, disk_w, net_rx, net_tx = self._io_counters()
        try:
            process_count = len(psutil.pids())
        except OSError:
            process_count = None
        return HostSample(
            hostname=self.hostname,
            cpu_percent=round(sum(per_core) / len(per_core), 1) if per_core else None,
            cpu_per_core=per_core,
            cpu_count=len(per_core),
            iowait=getattr(times, "iowait", None),
            steal=getattr(times, "steal", None),
            load_1=load[0],
            load_5=load[1],
            load_15=load[2],
            memory_used=mem.total - mem.available,
            memory_total=mem.total,
            swap_used=swap.used,
            swap_total=swap.total,
            disk_read_bps=disk_r,
            disk_write_bps=disk_w,
            net_rx_bps=net_rx,
            net_tx_bps=net_tx,
            process_count=process_count,
        )

    # -- processes ----------------------------------------------------------------------------

    def _track(self, pid: int) -> _Tracked | None:
        self._seen.add(pid)
        tracked = self._tracked.get(pid)
        try:
            if tracked is not None and tracked.proc.create_time() == tracked.create_time:
                return tracked
            proc = psutil.Process(pid)
            tracked = _Tracked(proc, proc.create_time())
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, ValueError):
            self._tracked.pop(pid, None)
            return None
        self._tracked[pid] = tracked
        return tracked

    def _cpu(self, tracked: _Tracked) -> float | None:
        value = tracked.proc.cpu_percent()
        if not tracked.measured:
            tracked.measured = True
            return self._lifetime_cpu(tracked) if self.lifetime_first else None
        return round(value, 1)

    @staticmethod
    def _lifetime_cpu(tracked: _Tracked) -> float | None:
        """Share of one core used since the process started (user + system over its age)."""
        try:
            times = tracked.proc.cpu_times()
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            return None
        age = time.time() - tracked.create_time
        if age <= 0:
            return None
        return round(100.0 * (times.user + times.system) / age, 1)

    def sample_process(self, pid: int, gpu_mem: int | None = None, sm_util: float | None = None) -> ProcSample:
        """One GPU process and its direct children (DataLoader workers). Never raises."""
        tracked = self._track(pid)
        if tracked is None:
            return ProcSample(pid=pid, name="(not visible: other pid namespace?)", gpu_mem=gpu_mem,
                              sm_util=sm_util, visible=False)
        proc = tracked.proc
        try:
            with proc.oneshot():
                info = proc.as_dict(attrs=_ATTRS, ad_value=None)
                cpu = self._cpu(tracked)
            children = self._children_of(pid)
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            self._tracked.pop(pid, None)
            return ProcSample(pid=pid, name="(exited)", gpu_mem=gpu_mem, sm_util=sm_util, visible=False)
        except psutil.AccessDenied:
            info, cpu, children = {"name": None}, None, []
        workers = []
        for child in children:
            worker = self._sample_worker(child)
            if worker is not None:
                workers.append(worker)
        mem = info.get("memory_info")
        cmdline = info.get("cmdline") or []
        return ProcSample(
            pid=pid,
            name=info.get("name") or "?",
            gpu_mem=gpu_mem,
            sm_util=sm_util,
            cpu_percent=cpu,
            rss=mem.rss if mem is not None else None,
            user=info.get("username"),
            state=info.get("status"),
            threads=info.get("num_threads"),
            create_time=info.get("create_time"),
            cmdline=" ".join(cmdline),
            ppid=info.get("ppid"),
            workers=tuple(workers),
        )

    def _children_of(self, pid: int) -> list[int]:
        now = time.monotonic()
        if pid not in self._known or now - self._children_at > self.CHILDREN_REFRESH_S:
            children: dict[int, list[int]] = {}
            ppids = _ppid_map()
            for child, parent in ppids.items():
                children.setdefault(parent, []).append(child)
            self._children, self._known, self._children_at = children, set(ppids), now
        return sorted(self._children.get(pid, []))

    def _sample_worker(self, pid: int) -> WorkerSample | None:
        tracked = self._track(pid)
        if tracked is None:
            return None
        try:
            with tracked.proc.oneshot():
                cpu = self._cpu(tracked)
                name = tracked.proc.name()
                rss = tracked.proc.memory_info().rss
                state = tracked.proc.status()
                threads = tracked.proc.num_threads()
        except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
            return None
        return WorkerSample(pid=pid, name=name, cpu_percent=cpu, rss=rss, state=state, threads=threads)

    def end_tick(self) -> None:
        """Drop processes not looked at this tick, so the cache stays as small as the jobs."""
        for pid in list(self._tracked):
            if pid not in self._seen:
                del self._tracked[pid]
        self._seen = set()
