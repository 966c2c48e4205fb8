"""Whether a job waits for a CPU, from the kernel's own accounting.

* Run-queue wait: /proc/PID/task/TID/schedstat holds, per thread, the nanoseconds it ran on a
  CPU and the nanoseconds it was runnable but waited in a run queue (``sched_info``, kept by
  every kernel with CONFIG_SCHED_INFO). Between two ticks, over a process's threads and its
  DataLoader workers', ``wait / (run + wait)`` is the share of the time the job wanted a CPU and
  had none: what a busy host takes from it. Load average and CPU % cannot say that: a load of
  40 on 2 cores may be 40 sleepers in D state, and a 30 % CPU share may be all it asked for.
* CPU quota: a cgroup's cpu.stat (v2: ``nr_periods``, ``nr_throttled``, ``throttled_usec``;
  v1: ``throttled_time`` in ns) and its quota (v2 ``cpu.max``, v1 ``cpu.cfs_quota_us``), where a
  Kubernetes CPU limit or Slurm's ``--cpus-per-task`` put the job.
* Pressure: /proc/pressure/cpu's ``some avg10`` (kernels with PSI), the share of the last 10 s
  in which some runnable task waited for a CPU, host-wide.
* Who else: a pass over /proc (CPU time per process, by user), only while a watched job waits,
  at most every ``USERS_EVERY_S``; another user's processes are named by the user only.

Every read is one small /proc or /sys file; what cannot be read is ``None``, never a guess.
"""

from __future__ import annotations

import os
import pwd
import time
from collections.abc import Callable
from dataclasses import dataclass

from gputop.core.model import CpuUser, CpuWait

# The threads read per tree and tick (a process with thousands of threads costs no more).
MAX_THREADS = 512
# Look for who else uses the CPUs when a watched job waited this share of its runnable time
# in the last tick, or the host's CPU pressure is at least this (PSI, %).
LOOK_WAIT = 0.1
LOOK_PRESSURE = 10.0
USERS_EVERY_S = 5.0
TOP_USERS = 5
_CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
CGROUP_ROOT = "/sys/fs/cgroup"


def read_proc(path: str, size: int = 4096) -> bytes | None:
    """One os.read of a small /proc or cgroup file (no file object: these run per thread per
    tick); None when it is gone or not readable."""
    try:
        fd = os.open(path, os.O_RDONLY)
        try:
            return os.read(fd, size)
        finally:
            os.close(fd)
    except OSError:
        return None


def thread_clock(pid: int, tid: int) -> tuple[int, int] | None:
    """(ns on a CPU, ns waiting in a run queue) of one thread, or None."""
    data = read_proc(f"/proc/{pid}/task/{tid}/schedstat", 256)
    if data is None:
        return None
    try:
        run, wait = data.split()[:2]
        return int(run), int(wait)
    except ValueError:
        return None


def cpu_pressure(path: str = "/proc/pressure/cpu") -> float | None:
    """PSI's ``some avg10`` of the CPU (%), or None without PSI."""
    data = read_proc(path)
    if data is None:
        return None
    for line in data.decode(errors="replace").splitlines():
        if line.startswith("some "):
            for word in line.split()[1:]:
                key, _, value = word.partition("=")
                if key == "avg10":
                    try:
                        share = float(value)
                    except ValueError:
                        return None
                    return share if 0.0 <= share <= 100.0 else None
    return None


@dataclass(frozen=True)
class _Cgroup:
    path: str  # the cgroup as /proc/PID/cgroup names it
    stat: str  # its cpu.stat
    quota: float | None  # cores


def cgroup_of(pid: int, root: str = CGROUP_ROOT) -> _Cgroup | None:
    """The cgroup that holds the process's CPU controller (v2, else v1), or None."""
    data = read_proc(f"/proc/{pid}/cgroup", 65536)
    if data is None:
        return None
    v1 = v2 = None
    for line in data.decode(errors="replace").splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if parts[0] == "0" and parts[1] == "":
            v2 = parts[2]
        elif "cpu" in parts[1].split(","):
            v1 = (parts[1], parts[2])
    if v1 is not None:
        controllers, path = v1
        for folder in (controllers, "cpu", "cpu,cpuacct"):
            base = os.path.join(root, folder) + path.rstrip("/")
            if os.path.exists(base + "/cpu.stat"):
                return _Cgroup(path, base + "/cpu.stat", _v1_quota(base))
    if v2 is not None:
        base = root + v2.rstrip("/")
        if os.path.exists(base + "/cpu.stat"):
            return _Cgroup(v2, base + "/cpu.stat", _v2_quota(base))
    return None


def _v2_quota(base: str) -> float | None:
    data = read_proc(base + "/cpu.max", 128)
    try:
        quota, period = (data or b"").split()[:2]
        return None if quota == b"max" else int(quota) / int(period)
    except ValueError:
        return None


def _v1_quota(base: str) -> float | None:
    try:
        quota = int(read_proc(base + "/cpu.cfs_quota_us", 64) or b"")
        period = int(read_proc(base + "/cpu.cfs_period_us", 64) or b"")
    except ValueError:
        return None
    return quota / period if quota > 0 and period > 0 else None


def throttling(stat_path: str) -> tuple[int, int, float] | None:
    """(periods, throttled periods, throttled seconds) so far, from a cgroup's cpu.stat."""
    data = read_proc(stat_path)
    if data is None:
        return None
    fields: dict[str, int] = {}
    for line in data.decode(errors="replace").splitlines():
        key, _, value = line.partition(" ")
        try:
            fields[key] = int(value)
        except ValueError:
            continue
    if "nr_periods" not in fields or "nr_throttled" not in fields:
        return None
    if "throttled_usec" in fields:
        seconds = fields["throttled_usec"] / 1e6
    else:
        seconds = fields.get("throttled_time", 0) / 1e9
    return fields["nr_periods"], fields["nr_throttled"], seconds


def _tids(pid: int) -> list[int]:
    try:
        names = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    return [int(n) for n in names[:MAX_THREADS] if n.isdigit()]


class CpuWaitTracker:
    """Per tick: a tree's run-queue wait (``tree``), the host's pressure and, while a job
    waits, who else uses the CPUs (``users``)."""

    def __init__(self) -> None:
        self._clocks: dict[tuple[int, int], tuple[int, int]] = {}  # (pid, tid) -> last
        self._seen: set[tuple[int, int]] = set()
        self._cgroups: dict[int, _Cgroup | None] = {}
        self._throttle: dict[str, tuple[int, int, float]] = {}
        self._cpu: dict[int, tuple[float, float]] = {}  # pid -> (monotonic, CPU s)
        self._users: tuple[CpuUser, ...] = ()
        self._users_at = -1e9
        self.max_wait = 0.0  # the largest wait share of this tick's trees
        self._last_max = 0.0  # and of the last tick's
        self._names: dict[int, str] = {}

    def tree(self, pid: int, workers: list[int]) -> CpuWait | None:
        """The process ``pid`` and its workers' threads since the last tick: None on first
        sight (no interval yet) or where schedstat cannot be read."""
        run = wait = 0
        threads = 0
        measured = False
        for owner in (pid, *workers):
            for tid in _tids(owner):
                clock = thread_clock(owner, tid)
                if clock is None:
                    continue
                key = (owner, tid)
                self._seen.add(key)
                last = self._clocks.get(key)
                self._clocks[key] = clock
                threads += 1
                if last is None:
                    continue
                measured = True
                run += max(0, clock[0] - last[0])
                wait += max(0, clock[1] - last[1])
        if not measured:
            return None
        if run + wait:
            self.max_wait = max(self.max_wait, wait / (run + wait))
        return CpuWait(run_s=run / 1e9, wait_s=wait / 1e9, threads=threads,
                       **self._throttled(pid))

    def _throttled(self, pid: int) -> dict:
        if pid not in self._cgroups:
            self._cgroups[pid] = cgroup_of(pid)
        group = self._cgroups[pid]
        if group is None:
            return {}
        now = throttling(group.stat)
        if now is None:
            return {"cgroup": group.path, "quota_cores": group.quota}
        last = self._throttle.get(group.stat)
        self._throttle[group.stat] = now
        out: dict = {"cgroup": group.path, "quota_cores": group.quota}
        if last is not None:
            out.update(periods=max(0, now[0] - last[0]),
                       throttled_periods=max(0, now[1] - last[1]),
                       throttled_s=max(0.0, now[2] - last[2]))
        return out

    def users(self, watched: set[int], pressure: float | None,
              listing: Callable[[], list[str] | None]) -> tuple[CpuUser, ...]:
        """Who else uses the CPUs, by user, refreshed while a watched job waits. LISTING gives
        the tick's pids in /proc (shared with the other scans of the tick)."""
        now = time.monotonic()
        wanted = self._last_max >= LOOK_WAIT or (pressure is not None and pressure >= LOOK_PRESSURE)
        if not wanted:
            self._users = ()
        elif now - self._users_at >= USERS_EVERY_S:
            self._users = self._scan(listing() or [], watched | {os.getpid()}, now)
            self._users_at = now
        return self._users

    def _scan(self, names: list[str], skip: set[int], now: float) -> tuple[CpuUser, ...]:
        me = os.getuid()
        per_user: dict[int, list[tuple[float, str]]] = {}
        cpu: dict[int, tuple[float, float]] = {}
        boot = _boot_time()
        for name in names:
            pid = int(name)
            data = read_proc(f"/proc/{pid}/stat")
            if data is None:
                continue
            try:
                head, _, rest = data.rpartition(b")")
                f = rest.split()
                used = (int(f[11]) + int(f[12])) / _CLK_TCK
                started = int(f[19]) / _CLK_TCK
                uid = os.stat(f"/proc/{pid}").st_uid
            except (IndexError, ValueError, OSError):
                continue
            cpu[pid] = (now, used)
            if pid in skip or int(f[1]) in skip:  # a watched job, its workers, gputop
                continue
            last = self._cpu.get(pid)
            if last is not None and now > last[0]:
                share = max(0.0, used - last[1]) / (now - last[0])
            else:  # first sight: its lifetime share, as `ps` shows
                age = time.time() - boot - started if boot is not None else 0.0
                share = used / age if age > 1.0 else 0.0
            if share >= 0.01:
                per_user.setdefault(uid, []).append(
                    (share * 100.0, f"{head.partition(b'(')[2].decode(errors='replace')} "
                                    f"(pid {pid})"))
        self._cpu = cpu
        out = []
        for uid, procs in per_user.items():
            procs.sort(reverse=True)
            out.append(CpuUser(user=self._user_name(uid), cpu_percent=round(sum(p for p, _ in procs), 1),
                               processes=len(procs), top=procs[0][1] if uid == me else None))
        out.sort(key=lambda u: -u.cpu_percent)
        return tuple(out[:TOP_USERS])

    def _user_name(self, uid: int) -> str:
        if uid not in self._names:
            try:
                self._names[uid] = pwd.getpwuid(uid).pw_name
            except KeyError:
                self._names[uid] = f"uid {uid}"
        return self._names[uid]

    def end_tick(self) -> None:
        """Forget threads not read this tick."""
        for key in list(self._clocks):
            if key not in self._seen:
                del self._clocks[key]
        self._seen = set()
        self._last_max, self.max_wait = self.max_wait, 0.0
        alive = {pid for pid, _ in self._clocks}
        for pid in list(self._cgroups):
            if pid not in alive:
                del self._cgroups[pid]


def _boot_time() -> float | None:
    data = read_proc("/proc/stat", 1 << 16)
    for line in (data or b"").decode(errors="replace").splitlines():
        if line.startswith("btime "):
            try:
                return float(line.split()[1])
            except (IndexError, ValueError):
                return None
    return None
