"""The job waits for a CPU: ``cpu-contention``.

Measured from the kernel's accounting (``collect.cpu_wait``), not inferred from load average or
CPU %: over the window, the share of the time the job's threads (its training thread, its
DataLoader workers) were runnable but sat in a run queue, ``wait / (run + wait)``. Raised when

* that share is at least ``CONTENDED`` (a quarter of the time it wanted a CPU, the critical
  share of every rule: its steps take 1.33x as long or more for the host alone) and other
  processes used at least ``OTHERS_MIN`` of a core meanwhile (a job whose own threads
  outnumber the cores waits for itself: that is its own business, ``dataloader-stall``'s or
  ``host-bound``'s); or
* its cgroup's CPU quota throttled it in a ``THROTTLED_MIN`` share of the window (a Kubernetes
  CPU limit, Slurm's ``--cpus-per-task``): the quota, not other jobs, holds it back.

Only where its GPU idles (at least ``WARNING_SHARE``): a GPU kept busy loses nothing to the
host's wait; the cost is the smaller of the wait share and the GPU's idle share. When it holds
it is the GPU's root cause, ahead of the symptoms the wait inflates (a starved
DataLoader, a host-bound training thread, an idle GPU): those are listed as its effects.
"""

from __future__ import annotations

from gputop.core.model import CpuUser, GpuSample, Snapshot
from gputop.diagnostics.findings import Finding
from gputop.diagnostics.live.common import WARNING_SHARE, WINDOW_S, pct, pids, severity_for
from gputop.diagnostics.live.windows import _Context

CONTENDED = 0.25
OTHERS_MIN = 50.0  # % of a core
THROTTLED_MIN = 0.05
SHOWN_USERS = 3
WHO_CMD = "ps -e -o user,pid,pcpu,comm --sort=-pcpu | head"


def _waits(gpus: list[GpuSample], pid: int) -> tuple[float, float, float, int, float | None, str | None]:
    """(run s, wait s, throttled s, threads, quota cores, cgroup) of ``pid``'s tree."""
    run = wait = throttled = 0.0
    threads = 0
    quota = cgroup = None
    for g in gpus:
        for p in g.processes:
            cw = p.cpu_wait
            if p.pid != pid or cw is None:
                continue
            if not (0 <= cw.run_s < 1e6 and 0 <= cw.wait_s < 1e6):
                continue  # untrusted (a recording): a share of nonsense is no evidence
            run += cw.run_s
            wait += cw.wait_s
            if cw.throttled_s is not None and 0 <= cw.throttled_s < 1e6:
                throttled += cw.throttled_s
            threads, quota, cgroup = cw.threads, cw.quota_cores, cw.cgroup
    return run, wait, throttled, threads, quota, cgroup


def _others(window: list[Snapshot]) -> tuple[CpuUser, ...]:
    """The newest list of who else uses the CPUs in the window."""
    for snap in reversed(window):
        if snap.host.cpu_users:
            return snap.host.cpu_users
    return ()


def who_text(users: tuple[CpuUser, ...]) -> str:
    parts = []
    for u in users[:SHOWN_USERS]:
        top = f", busiest {u.top}" if u.top else ""
        plural = "es" if u.processes != 1 else ""
        parts.append(f"user {u.user} {u.cpu_percent:.0f}% of a core ({u.processes} "
                     f"process{plural}{top})")
    return "; ".join(parts)


def _pressure(window: list[Snapshot]) -> str:
    values = [s.host.cpu_pressure for s in window if s.host.cpu_pressure is not None]
    if not values:
        return ""
    return f"; the kernel's CPU pressure {values[-1]:.0f}% (PSI some avg10)"


def rule_cpu_contention(ctx: _Context) -> list[Finding]:
    out = []
    users = _others(ctx.window)
    others_cpu = sum(u.cpu_percent for u in users)
    host = ctx.window[-1].host
    cores = host.cpu_count or len(host.cpu_per_core) or None
    for index, gpus in ctx.per_gpu():
        util = ctx.readings(index, gpus).util
        if util is None:
            continue
        idle = 1.0 - util / 100.0
        if idle < WARNING_SHARE:
            continue  # a GPU kept busy loses nothing to the host's wait
        for pid in pids(gpus):
            run, wait, throttled, threads, quota, cgroup = _waits(gpus, pid)
            wanted = run + wait
            if wanted <= 0:
                continue
            share = wait / wanted
            throttled_share = throttled / WINDOW_S
            waited = (f"the {threads} threads of pid {pid} and its DataLoader workers were "
                      f"runnable but waited for a CPU {pct(share)} of the time they wanted "
                      f"one ({wait:.1f} s waiting, {run:.1f} s running over "
                      f"{WINDOW_S:.0f} s: the kernel's run-queue accounting, schedstat)")
            if quota is not None and throttled_share >= THROTTLED_MIN:
                cost = min(idle, max(share, min(1.0, throttled_share)))
                title = (f"pid {pid} (GPU {index}) throttled by its cgroup's CPU quota "
                         f"({quota:.2g} cores)")
                evidence = (f"its cgroup {cgroup} was throttled {throttled:.1f} s of "
                            f"{WINDOW_S:.0f} s under a quota of {quota:.2g} cores (cpu.stat); "
                            f"{waited}")
                fix = ("Raise the job's CPU limit or request: Kubernetes resources.limits.cpu "
                       "(or no limit, with a request), Slurm --cpus-per-task; or use fewer "
                       "DataLoader workers than the quota's cores")
            elif share >= CONTENDED and others_cpu >= OTHERS_MIN:
                cost = min(idle, share)
                on = f" ({cores})" if cores else ""
                title = f"pid {pid} (GPU {index}) waits for a CPU: other processes use the host's cores{on}"
                evidence = (f"{waited}; meanwhile others used {others_cpu:.0f}% of a core: "
                            f"{who_text(users)}{_pressure(ctx.window)}")
                fix = ("Give the job cores of its own: run it where the other work is not, "
                       "pin them apart (taskset / cpusets), ask the scheduler for dedicated "
                       "cores (Slurm --exclusive or --cpus-per-task, Kubernetes Guaranteed "
                       "QoS with whole-CPU requests); the symptoms below follow from the wait")
            else:
                continue
            out.append(Finding(
                id="cpu-contention",
                severity=severity_for(cost),
                title=title,
                evidence=evidence,
                fix=fix,
                next_step=WHO_CMD,
                cost_s=cost * WINDOW_S,
                gpu=index,
                pid=pid,
            ))
    return out
