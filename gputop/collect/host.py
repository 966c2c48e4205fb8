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
from typing import Any

import psutil

from gputop.collect.cpu_wait import CpuWaitTracker, cpu_pressure
from gputop.collect.cpu_wait import read_proc as _read_proc
from gputop.core.model import HostSample, ProcSample, WorkerSample

# Per tick a process costs one read of /proc/PID/stat (state, parent, CPU time, threads,
# resident memory: what psutil gathers from three files and a passwd lookup); its user and
# command line are read through psutil when it is first seen and every STATIC_REFRESH_S after
# (a command line can change: setproctitle).
STATIC_REFRESH_S = 10.0
_CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_STATES = {"R": "running", "S": "sleeping", "D": "disk-sleep", "T": "stopped",
           "t": "tracing-stop", "Z": "zombie", "X": "dead", "x": "dead", "K": "wake-kill",
           "W": "waking", "I": "idle", "P": "parked"}


@dataclass(frozen=True)
class _Stat:
    name: str
    state: str
    ppid: int
    cpu_s: float  # user + system seconds
    threads: int
    start_ticks: int  # clock ticks after boot: with the pid, names the process
    rss: int


def _read_stat(pid: int) -> _Stat | None:
    """One read of /proc/PID/stat; None when the process is gone or not visible."""
    data = _read_proc(f"/proc/{pid}/stat")
    if data is None:
        return None
    try:
        head, _, rest = data.rpartition(b")")
        name = head.partition(b"(")[2].decode(errors="replace")
        f = rest.split()
        # Fields after the name, from 0: state, ppid, ..., utime 11, stime 12, threads 17,
        # starttime 19, rss 21 (man 5 proc, counting from field 3).
        return _Stat(name, _STATES.get(f[0].decode(), f[0].decode()), int(f[1]),
                     (int(f[11]) + int(f[12])) / _CLK_TCK, int(f[17]), int(f[19]),
                     int(f[21]) * _PAGE)
    except (IndexError, ValueError):
        return None


@dataclass
class _Tracked:
    start_ticks: int
    create_time: float | None = None
    last: tuple[float, float] | None = None  # (monotonic time, CPU seconds) of the last tick
    static: dict | None = None  # username and cmdline
    static_at: float = 0.0


def _list_proc() -> list[str] | None:
    """The pids in /proc, as names; None where /proc cannot be listed."""
    try:
        return [name for name in os.listdir("/proc") if name.isdigit()]
    except OSError:
        return None


def _ppid_map(names: list[str] | None = None) -> dict[int, int]:
    """pid -> parent pid for every process in NAMES (the tick's listing of /proc; listed here
    when not given): one pass (O(all processes)), each /proc/PID/stat read with os.read
    (psutil's own pass opens a file object per process, 3x the cost)."""
    if names is None:
        names = _list_proc()
    if names is None or not os.path.exists("/proc/self/stat"):
        return {p.pid: p.info["ppid"] for p in psutil.process_iter(["ppid"])}
    out: dict[int, int] = {}
    for name in names:
        data = _read_proc(f"/proc/{name}/stat")
        if data is None:
            continue  # gone meanwhile, or not readable
        try:
            out[int(name)] = int(data[data.rfind(b")") + 2:].split(None, 2)[1])
        except (ValueError, IndexError):
            continue
    return out


def _main_thread_children(pid: int) -> list[int] | None:
    """The children the process's main thread forked (where DataLoader workers come from),
    from /proc/PID/task/PID/children: one read instead of a scan of every process. None
    where the kernel lacks the file (CONFIG_PROC_CHILDREN) or the process is gone."""
    data = _read_proc(f"/proc/{pid}/task/{pid}/children", 65536)
    if data is None:
        return None
    try:
        return [int(child) for child in data.split()]
    except ValueError:
        return None


class HostCollector:
    # Every tick a GPU process's children are read from its main thread's children file;
    # children forked by other threads are found by a scan of every process (O(all
    # processes)), done this often (and at once for a process not seen by the last scan);
    # without the children file, every CHILDREN_SCAN_ONLY_S (workers come and go at epoch
    # boundaries, not every second).
    CHILDREN_REFRESH_S = 10.0
    CHILDREN_SCAN_ONLY_S = 2.0
    SLOW_TICKS = 5
    COUNT_FRESH_S = 5.0  # a workers' scan this recent gives the process count too

    def __init__(self, lifetime_first: bool = False) -> None:
        self.hostname = socket.gethostname()
        self.lifetime_first = lifetime_first
        self._tracked: dict[int, _Tracked] = {}
        self._seen: set[int] = set()
        self._children: dict[int, list[int]] = {}
        self._known: set[int] = set()  # pids that existed at the last scan
        self._children_at = -1e9
        self._listing: list[str] | None = None  # this tick's listing of /proc
        self._last_io: tuple[float, Any, dict[str, Any]] | None = None  # psutil's counters
        self._ticks = 0
        self._io_rates: tuple[float | None, float | None, float | None, float | None] | None = None
        self._slow: tuple[int, int, int | None] | None = None
        self._waits = CpuWaitTracker()
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
        load = os.getloadavg()
        # Disk and network rates over two ticks: psutil's disk counters look up every
        # device in /sys each call, the costliest read of the host's.
        if self._io_rates is None or self._ticks % 2 == 0:
            self._io_rates = self._io_counters()
        disk_r, disk_w, net_rx, net_tx = self._io_rates
        # Swap and the process count move slowly and cost two more reads of /proc each:
        # every SLOW_TICKS ticks, as the GPUs' slow fields.
        if self._slow is None or self._ticks % self.SLOW_TICKS == 0:
            swap = psutil.swap_memory()
            process_count: int | None
            if self._known and time.monotonic() - self._children_at < self.COUNT_FRESH_S:
                # The workers' scan listed every process a moment ago: one /proc pass, shared.
                process_count = len(self._known)
            else:
                names = self._proc_names()
                try:
                    process_count = len(names) if names is not None else len(psutil.pids())
                except OSError:
                    process_count = None
            self._slow = (swap.used, swap.total, process_count)
        self._ticks += 1
        swap_used, swap_total, process_count = self._slow
        pressure = cpu_pressure()
        users = self._waits.users(set(self._tracked), pressure, self._proc_names)
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
            swap_used=swap_used,
            swap_total=swap_total,
            disk_read_bps=disk_r,
            disk_write_bps=disk_w,
            net_rx_bps=net_rx,
            net_tx_bps=net_tx,
            process_count=process_count,
            cpu_pressure=pressure,
            cpu_users=users,
        )

    # -- processes ----------------------------------------------------------------------------

    def _track(self, pid: int) -> tuple[_Tracked, _Stat] | None:
        self._seen.add(pid)
        stat = _read_stat(pid)
        if stat is None or stat.state == "zombie":
            self._tracked.pop(pid, None)
            return None
        tracked = self._tracked.get(pid)
        if tracked is None or tracked.start_ticks != stat.start_ticks:  # new, or pid reused
            tracked = self._tracked[pid] = _Tracked(stat.start_ticks)
        return tracked, stat

    def _cpu(self, tracked: _Tracked, stat: _Stat) -> float | None:
        """% of one core since the last tick (as psutil's cpu_percent); on first sight None,
        or with ``lifetime_first`` the share since the process started."""
        now = time.monotonic()
        last, tracked.last = tracked.last, (now, stat.cpu_s)
        if last is None:
            if not self.lifetime_first:
                return None
            age = time.time() - self._create_time(tracked)
            return round(100.0 * stat.cpu_s / age, 1) if age > 0 else None
        elapsed = now - last[0]
        return round(100.0 * max(0.0, stat.cpu_s - last[1]) / elapsed, 1) if elapsed > 0 else 0.0

    def _create_time(self, tracked: _Tracked) -> float:
        if tracked.create_time is None:
            tracked.create_time = psutil.boot_time() + tracked.start_ticks / _CLK_TCK
        return tracked.create_time

    def _static(self, pid: int, tracked: _Tracked) -> dict:
        now = time.monotonic()
        if tracked.static is None or now - tracked.static_at > STATIC_REFRESH_S:
            try:
                tracked.static = psutil.Process(pid).as_dict(attrs=["username", "uids", "cmdline"],
                                                             ad_value=None)
            except (psutil.NoSuchProcess, psutil.ZombieProcess):
                tracked.static = {"username": None, "uids": None, "cmdline": None}
            tracked.static_at = now
        return tracked.static

    def sample_process(self, pid: int, gpu_mem: int | None = None, sm_util: float | None = None) -> ProcSample:
        """One GPU process and its direct children (DataLoader workers). Never raises."""
        found = self._track(pid)
        if found is None:
            return ProcSample(pid=pid, name="(not visible: other pid namespace?)", gpu_mem=gpu_mem,
                              sm_util=sm_util, visible=False)
        tracked, stat = found
        static = self._static(pid, tracked)
        name = stat.name
        argv0 = os.path.basename((static.get("cmdline") or [""])[0])
        if len(name) >= 15 and argv0.startswith(name):
            name = argv0  # the kernel keeps 15 characters of a name (as psutil's name())
        workers = []
        for child in self._children_of(pid):
            worker = self._sample_worker(child, pid)
            if worker is not None:
                workers.append(worker)
        cpu_wait = self._waits.tree(pid, [w.pid for w in workers])
        return ProcSample(
            pid=pid,
            name=name or "?",
            gpu_mem=gpu_mem,
            sm_util=sm_util,
            cpu_percent=self._cpu(tracked, stat),
            rss=stat.rss,
            user=static.get("username"),
            uid=static["uids"].real if static.get("uids") is not None else None,
            state=stat.state,
            threads=stat.threads,
            create_time=self._create_time(tracked),
            cmdline=" ".join(static.get("cmdline") or []),
            ppid=stat.ppid,
            workers=tuple(workers),
            cpu_wait=cpu_wait,
        )

    def _children_of(self, pid: int) -> list[int]:
        now = time.monotonic()
        main = _main_thread_children(pid)
        every = self.CHILDREN_REFRESH_S if main is not None else self.CHILDREN_SCAN_ONLY_S
        if pid not in self._known or now - self._children_at > every:
            children: dict[int, list[int]] = {}
            ppids = _ppid_map(self._proc_names())
            for child, parent in ppids.items():
                children.setdefault(parent, []).append(child)
            self._children, self._known, self._children_at = children, set(ppids), now
        found = set(self._children.get(pid, ()))
        found.update(main or ())
        return sorted(found)

    def _sample_worker(self, pid: int, parent: int) -> WorkerSample | None:
        found = self._track(pid)
        if found is None:
            return None
        tracked, stat = found
        if stat.ppid != parent:  # ended since the last scan, and the pid taken again
            return None
        return WorkerSample(pid=pid, name=stat.name, cpu_percent=self._cpu(tracked, stat),
                            rss=stat.rss, state=stat.state, threads=stat.threads)

    def end_tick(self) -> None:
        """Drop processes not looked at this tick, so the cache stays as small as the jobs."""
        for pid in list(self._tracked):
            if pid not in self._seen:
                del self._tracked[pid]
        self._seen = set()
        self._listing = None
        self._waits.end_tick()

    def _proc_names(self) -> list[str] | None:
        """This tick's listing of /proc, made once and shared by the process count, the
        workers' scan and the scan of who else uses the CPUs (issue 40: one listing a tick)."""
        if self._listing is None:
            self._listing = _list_proc()
        return self._listing
