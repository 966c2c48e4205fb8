"""Live rules: findings from windows of snapshots (NVML + psutil + agent telemetry).

Pure functions of the recent snapshots: no textual, no pynvml, no torch. ``LiveDiagnosis`` keeps
the last few minutes of snapshots, evaluates every rule on each new one, and raises a finding only
after its condition has held for ``raise_after`` seconds, and clears it only after the condition
has been absent for ``clear_after`` seconds, so findings do not flap.

Thresholds, and why:
* NVML "utilization" is the share of the sample period in which any kernel ran. A training job
  that keeps its GPU fed sits above 80-90 %; below 50 % half the GPU time is lost.
* A DataLoader worker is a process that turns samples into batches; at >= 60 % of a core on
  average it has no slack. The TensorBoard profiler plugin calls a step input-bound when the
  DataLoader takes >= 5 % of it and flags it high past 20 %; the agent's wait share uses 30 %.
* Throttling counts only while the GPU is busy and the SM clock is at least 10 % under its max:
  a power-capped idle GPU costs nothing.
* PCIe: usable bandwidth is ~80 % of the link's theoretical rate; at 60 % of it for a whole window
  while the GPU is under-used, copies are the bottleneck.
"""

from __future__ import annotations

import functools
import math
import os
import shlex
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, replace
from statistics import fmean

from gputop.diagnostics import next_steps as ns
from gputop.diagnostics.findings import Finding, finding_key, order_findings
from gputop.diagnostics.live_efficiency import rule_mfu_drop
from gputop.diagnostics.live_ranks import annotate, rank_imbalance
from gputop.job_groups import jobs_in
from gputop.model import GpuSample, ProcSample, Snapshot

WINDOW_S = 10.0  # most rules look at the last 10 s
# The same severity scale as the trace rules (cost share of the time): a finding that costs
# 5% is a warning, 25% critical, so a live finding and a capture of the same job agree.
WARNING_SHARE = 0.05
CRITICAL_SHARE = 0.25
# memory-growth fits a line to up to MEMORY_WINDOW_S of samples; it needs MEMORY_MIN_S of them
# to raise, and a rise that has held MEMORY_CRITICAL_S (not the allocator's first fill) to be
# called critical.
MEMORY_MIN_S = 10.0
MEMORY_CRITICAL_S = 60.0
HUNG_S = 60.0
MEMORY_WINDOW_S = 300.0
KEEP_S = 330.0

THROTTLE_EVENTS = ("sw_power_cap", "hw_slowdown", "sw_thermal", "hw_thermal", "hw_power_brake")
PCIE_GBS_PER_LANE = {1: 0.25, 2: 0.5, 3: 0.985, 4: 1.969, 5: 3.938, 6: 7.563}


# -- small helpers over a window -------------------------------------------------------------


def _mean(values: Iterable[float | None]) -> float | None:
    # statistics.fmean's own sum (fsum) without its overhead: rules call this ~100 times a
    # tick. ``v == v`` is False for NaN only.
    vals = [v for v in values if v is not None and v == v]
    return math.fsum(vals) / len(vals) if vals else None


def _proc_series(gpus: list[GpuSample], pid: int) -> list[ProcSample]:
    return [p for g in gpus for p in g.processes if p.pid == pid]


def _linear_fit(ts: list[float], ys: list[float]) -> tuple[float, float]:
    """Slope and R^2 of a least-squares line."""
    if len(ts) < 3:
        return 0.0, 0.0
    import numpy as np  # here: the monitor's first frame comes before numpy is loaded

    t = np.asarray(ts, dtype=np.float64) - ts[0]
    y = np.asarray(ys, dtype=np.float64)
    t -= t.mean()
    y = y - y.mean()
    sxx, sxy, syy = float(t @ t), float(t @ y), float(y @ y)
    if sxx == 0:
        return 0.0, 0.0
    return sxy / sxx, (sxy * sxy) / (sxx * syy) if syy > 0 else 0.0


def severity_for(share: float) -> str:
    if share >= CRITICAL_SHARE:
        return "critical"
    return "warning" if share >= WARNING_SHARE else "info"


def _gib(value: float) -> str:
    return f"{value / 1024**3:.1f} GiB"


def _look_deeper(gpus: list[GpuSample], pid: int | None, extra: str = "") -> str:
    """A command that runs as printed on the live process: a capture through its agent, else
    py-spy on its Python stacks (Nsight tools cannot attach to a running process)."""
    if pid is None:
        return "nvidia-smi --query-compute-apps=pid,used_memory --format=csv"
    procs = _proc_series(gpus, pid)
    if procs and procs[-1].agent:
        return ns.gputop_capture(pid) + extra
    return ns.pyspy_dump(pid)


def _relaunch(gpus: list[GpuSample], pid: int | None) -> str:
    """The process's own command line, to relaunch it under a profiler."""
    procs = _proc_series(gpus, pid) if pid is not None else []
    cmdline = procs[-1].cmdline if procs else ""
    return _app_of(cmdline) if cmdline else ns.APP


@functools.lru_cache(maxsize=256)
def _app_of(cmdline: str) -> str:
    """The application part of a command line: a finding asks for it every tick."""
    try:
        words = shlex.split(cmdline)
    except ValueError:  # an unbalanced quote in what the process shows as its command
        words = cmdline.split()
    return ns.app_of(words)


class _RunningFit:
    """Least squares over a sliding window of (time, bytes) points, kept as exact integer sums
    (times in microseconds from the first point) that points join and leave one at a time: the
    fit costs the same whatever the window holds, and removal never accumulates rounding."""

    __slots__ = ("points", "origin", "n", "st", "sy", "stt", "sty", "syy")

    def __init__(self) -> None:
        self.points: deque[tuple[float, int, int]] = deque()  # (time, t in us, bytes)
        self.origin: float | None = None
        self.n = self.st = self.sy = self.stt = self.sty = self.syy = 0

    def add(self, t: float, y: int) -> None:
        if self.origin is None:
            self.origin = t
        tu = round((t - self.origin) * 1e6)
        self.points.append((t, tu, y))
        self.n += 1
        self.st += tu
        self.sy += y
        self.stt += tu * tu
        self.sty += tu * y
        self.syy += y * y

    def trim(self, oldest: float) -> None:
        """Drop the points before ``oldest``."""
        points = self.points
        while points and points[0][0] < oldest:
            _, tu, y = points.popleft()
            self.n -= 1
            self.st -= tu
            self.sy -= y
            self.stt -= tu * tu
            self.sty -= tu * y
            self.syy -= y * y
        if not points:
            self.origin = None

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


class _GpuWindows:
    """One GPU's recent samples, kept up to date one snapshot at a time: the rules' window, the
    hang window, the time it last did work, and the memory fit."""

    __slots__ = ("window", "hang", "last_busy", "memory")

    def __init__(self) -> None:
        self.window: deque[tuple[float, GpuSample]] = deque()  # the last WINDOW_S
        self.hang: deque[tuple[float, GpuSample]] = deque()  # the last HUNG_S
        self.last_busy: float | None = None  # the last sample with GPU work (util >= 1 %)
        self.memory = _RunningFit()  # mem_used over the last MEMORY_WINDOW_S

    def add(self, t: float, g: GpuSample) -> None:
        self.window.append((t, g))
        self.hang.append((t, g))
        if (g.util_gpu or 0) >= 1:
            self.last_busy = t
        if g.mem_used is not None:
            self.memory.add(t, int(g.mem_used))

    def trim(self, now: float) -> None:
        for samples, span in ((self.window, WINDOW_S), (self.hang, HUNG_S)):
            oldest = now - span
            while samples and samples[0][0] < oldest:
                samples.popleft()
        self.memory.trim(now - MEMORY_WINDOW_S)


class _Windows:
    """What the rules read, updated per snapshot at a cost that does not grow with the
    history kept: the snapshots of the last WINDOW_S, per-GPU windows, and how far back the
    history goes (KEEP_S at most)."""

    def __init__(self) -> None:
        self.snapshots: deque[Snapshot] = deque()  # the last WINDOW_S
        self.times: deque[float] = deque()  # every snapshot kept (KEEP_S)
        self.gpus: dict[int, _GpuWindows] = {}  # in the order the GPUs were first seen

    def add(self, snap: Snapshot) -> None:
        now = snap.time
        self.snapshots.append(snap)
        self.times.append(now)
        for g in snap.gpus:
            state = self.gpus.get(g.index)
            if state is None:
                state = self.gpus[g.index] = _GpuWindows()
            state.add(now, g)
        while self.snapshots and self.snapshots[0].time < now - WINDOW_S:
            self.snapshots.popleft()
        while self.times and self.times[0] < now - KEEP_S:
            self.times.popleft()
        for state in self.gpus.values():
            state.trim(now)

    def context(self, own_pid: int | None) -> _Context | None:
        """The rules' view of the newest snapshot, or None while the window is too short."""
        if len(self.snapshots) < 3:
            return None
        newest = self.snapshots[-1]
        current = {g.index for g in newest.gpus}
        return _Context(
            window=list(self.snapshots),
            own_pid=own_pid or os.getpid(),
            now=newest.time,
            span=newest.time - self.times[0],
            gpus={i: s for i, s in self.gpus.items() if i in current and s.window},
        )


@dataclass
class _Context:
    window: list[Snapshot]  # the last WINDOW_S seconds
    own_pid: int
    now: float  # the newest snapshot's time
    span: float  # how far back the history kept goes (up to KEEP_S)
    gpus: dict[int, _GpuWindows]  # the GPUs of the newest snapshot
    _per_gpu: list[tuple[int, list[GpuSample]]] | None = None
    _host_cpu: float | None = None

    def host_cpu(self) -> float:
        """The host's mean CPU % over the window (0 when unknown)."""
        if self._host_cpu is None:
            self._host_cpu = _mean(s.host.cpu_percent for s in self.window) or 0.0
        return self._host_cpu

    def per_gpu(self) -> list[tuple[int, list[GpuSample]]]:
        """(index, samples of the last WINDOW_S) of every GPU of the newest snapshot."""
        if self._per_gpu is None:
            self._per_gpu = [(i, [g for _, g in s.window]) for i, s in self.gpus.items()]
        return self._per_gpu


# -- the rules: each returns the findings whose condition holds now ---------------------------


@dataclass(frozen=True)
class _TreeLoad:
    """How busy one training process and its DataLoader workers were over the window."""

    main_cpu: float | None
    main_runnable: float
    n_workers: int
    worker_cpu: float | None
    worker_runnable: float
    wait_share: float | None  # from the agent
    host_cpu: float


def _tree_load(ctx: _Context, gpus: list[GpuSample], pid: int) -> _TreeLoad:
    """One pass over the window (three rules ask this of every GPU process).

    The runnable shares are the share of samples in which a process was running or waiting
    for a CPU (state R): a CPU-bound process on an oversubscribed host gets less than a core,
    so its CPU % understates how busy it is, but it is runnable whenever it is not given the
    CPU; one /proc read per tick is an instant, so over a window this estimates the share of
    time it wanted a CPU."""
    main_cpu: list[float] = []
    worker_cpu: list[float] = []
    waits: list[float] = []
    main_states = main_running = worker_states = worker_running = 0
    last = None
    for g in gpus:
        for p in g.processes:
            if p.pid != pid:
                continue
            last = p
            if p.cpu_percent is not None and p.cpu_percent == p.cpu_percent:
                main_cpu.append(p.cpu_percent)
            if p.state:
                main_states += 1
                main_running += p.state == "running"
            if p.agent:
                wait = p.agent.get("dataloader_wait_share")
                if wait is not None and wait == wait:
                    waits.append(wait)
            for w in p.workers:
                if w.cpu_percent is not None and w.cpu_percent == w.cpu_percent:
                    worker_cpu.append(w.cpu_percent)
                if w.state:
                    worker_states += 1
                    worker_running += w.state == "running"
    return _TreeLoad(
        main_cpu=_mean(main_cpu),
        main_runnable=main_running / main_states if main_states else 0.0,
        n_workers=len(last.workers) if last is not None else 0,
        worker_cpu=_mean(worker_cpu),
        worker_runnable=worker_running / worker_states if worker_states else 0.0,
        wait_share=_mean(waits),
        host_cpu=ctx.host_cpu(),
    )


def rule_dataloader_stall(ctx: _Context) -> list[Finding]:
    out = []
    for index, gpus in ctx.per_gpu():
        util = _mean(g.util_gpu for g in gpus)
        if util is None:
            continue
        idle = 1 - util / 100  # NVML utilization counts time with any kernel running
        for pid in _pids(gpus):
            load = _tree_load(ctx, gpus, pid)
            main_cpu, n_workers, worker_cpu = load.main_cpu, load.n_workers, load.worker_cpu
            wait_share, host_cpu = load.wait_share, load.host_cpu
            if wait_share is not None:
                # The agent times the loop's wait in DataLoader.__next__ directly: it decides,
                # whatever NVML's indirect utilization says. The GPU cannot lose more than it
                # is idle, so the cost is the smaller of the two.
                share = min(wait_share, idle)
                if wait_share < WARNING_SHARE or share < WARNING_SHARE:
                    continue
                why = (f"the agent measures the training loop waiting for the DataLoader "
                       f"{wait_share * 100:.0f}% of each step (NVML: GPU busy {util:.0f}%)")
            elif util >= 50:
                continue
            elif n_workers and worker_cpu is not None and worker_cpu >= 60:
                why = f"its {n_workers} DataLoader workers run at {worker_cpu:.0f}% of a core each"
            elif n_workers and load.worker_runnable >= 0.7 and host_cpu >= 90:
                why = (f"its {n_workers} workers are CPU-bound (runnable {load.worker_runnable * 100:.0f}% "
                       f"of the time, {worker_cpu or 0:.0f}% of a core each) on a host with no CPU "
                       f"left ({host_cpu:.0f}% busy)")
            elif not n_workers and util < 35 and (
                (main_cpu or 0) >= 80 or (load.main_runnable >= 0.8 and host_cpu >= 90)
            ):
                why = (f"it has no DataLoader workers and its main process is CPU-bound "
                       f"({main_cpu or 0:.0f}% of a core): loading in the training loop, num_workers=0")
            else:
                continue
            if wait_share is None:
                share = idle
            out.append(Finding(
                id="dataloader-stall",
                severity=severity_for(share),
                title=f"GPU {index} starved by the input pipeline of pid {pid}",
                evidence=f"GPU {index} busy {util:.0f}% over {WINDOW_S:.0f} s while {why}",
                fix=("Raise DataLoader num_workers (up to the free cores), set pin_memory=True and "
                     "persistent_workers=True, move heavy transforms to the GPU or precompute them"),
                next_step=_look_deeper(gpus, pid),
                cost_s=share * WINDOW_S,
                gpu=index,
                pid=pid,
            ))
    return out


def rule_host_sync(ctx: _Context) -> list[Finding]:
    out = []
    for index, gpus in ctx.per_gpu():
        utils = [g.util_gpu for g in gpus if g.util_gpu is not None]
        if len(utils) < 5:
            continue
        mean = fmean(utils)
        low = sum(u < 15 for u in utils) / len(utils)
        high = max(utils)
        # A saw-tooth: the queue fills, then drains to zero at every sync; the average stays
        # well above a starved GPU's, but a real share of samples is near zero.
        if not (mean >= 35 and high >= 80 and 0.1 <= low <= 0.6):
            continue
        for pid in _pids(gpus):
            load = _tree_load(ctx, gpus, pid)
            main_cpu, runnable = load.main_cpu, load.main_runnable
            cpu_bound = (main_cpu or 0) >= 70 or (runnable >= 0.7 and load.host_cpu >= 90)
            if not cpu_bound or (load.wait_share or 0) >= 0.3:
                continue
            out.append(Finding(
                id="host-sync",
                severity="warning",
                title=f"pid {pid} blocks on GPU {index} every step",
                evidence=(f"GPU {index} utilization saw-tooth: mean {mean:.0f}%, peak {high:.0f}%, "
                          f"{low * 100:.0f}% of samples under 15%, main process CPU-bound "
                          f"({main_cpu or 0:.0f}% of a core, runnable {runnable * 100:.0f}% of the time)"),
                fix=("Remove per-step .item() / .cpu() / print(loss) / torch.cuda.synchronize() from "
                     "the loop; accumulate metrics on the GPU and read them every N steps"),
                next_step=_look_deeper(gpus, pid),
                cost_s=low * WINDOW_S,
                gpu=index,
                pid=pid,
            ))
    return out


def rule_gpu_idle(ctx: _Context) -> list[Finding]:
    out = []
    for index, gpus in ctx.per_gpu():
        last = gpus[-1]
        util = _mean(g.util_gpu for g in gpus)
        if util is None or util >= 5 or not last.mem_total or last.mem_used is None:
            continue
        if last.mem_used < 0.05 * last.mem_total or not last.processes:
            continue  # nothing holds the GPU: free, not idle
        tree_cpu = _mean(p.tree_cpu_percent for g in gpus for p in g.processes if p.visible)
        if tree_cpu is not None and tree_cpu >= 20:
            continue  # the CPU is working: another rule's business
        # On a saturated host a CPU-bound process gets little CPU time but is runnable all
        # the time: it is starved of CPU, not waiting on I/O (the input-pipeline rule's case).
        loads = [_tree_load(ctx, gpus, p.pid) for p in last.processes if p.visible]
        if any(ld.main_runnable >= 0.5 or ld.worker_runnable >= 0.5 for ld in loads):
            continue
        pids = ", ".join(str(p.pid) for p in last.processes)
        out.append(Finding(
            id="gpu-idle",
            severity="warning",
            title=f"GPU {index} held but idle",
            evidence=(f"GPU {index} busy {util:.0f}% over {WINDOW_S:.0f} s with {_gib(last.mem_used)} "
                      f"allocated by pid {pids}; their CPU use {tree_cpu or 0:.0f}%"),
            fix=("The job waits on something that is neither GPU nor CPU work: storage or "
                 "network I/O, a peer rank, a lock; the Python stack shows where it waits"),
            next_step=ns.pyspy_dump(last.processes[0].pid),
            cost_s=WINDOW_S,
            gpu=index,
            pid=last.processes[0].pid,
        ))
    return out


def _steps_in(samples: deque[tuple[float, GpuSample]], pid: int) -> tuple[object, object] | None:
    """The agent's step counts of ``pid`` at the start and at the end of ``samples`` (the
    first and the last reported), found from both ends: no walk over a busy minute."""
    def steps(items):
        for _, g in items:
            for p in g.processes:
                if p.pid == pid:
                    value = (p.agent or {}).get("steps")
                    if value is not None:
                        return value
        return None

    first = steps(samples)
    return None if first is None else (first, steps(reversed(samples)))


def rule_hung(ctx: _Context) -> list[Finding]:
    if ctx.span < HUNG_S:
        return []
    out = []
    for index, state in ctx.gpus.items():
        last = state.hang[-1][1]
        # Any GPU work in the last minute: not hung (the time of the last one is kept).
        if not last.processes or (state.last_busy is not None
                                  and state.last_busy >= ctx.now - HUNG_S):
            continue
        pid = last.processes[0].pid
        steps = _steps_in(state.hang, pid)
        if steps is not None and steps[1] != steps[0]:
            continue  # steps still advance: slow, not hung
        progress = "no step progress (agent)" if steps else "no agent to report steps"
        out.append(Finding(
            id="hung",
            severity="critical",
            title=f"GPU {index}: pid {pid} looks hung",
            evidence=f"no GPU work on GPU {index} for {HUNG_S:.0f} s; {progress}",
            fix=("Look where it is stuck: a collective waiting for a dead rank (set "
                 "NCCL_DEBUG=INFO, TORCH_NCCL_ASYNC_ERROR_HANDLING=1 and a timeout), a deadlocked "
                 "DataLoader, or blocking I/O"),
            next_step=ns.pyspy_dump(pid, native=True),
            cost_s=HUNG_S,
            gpu=index,
            pid=pid,
        ))
    return out


def rule_throttling(ctx: _Context) -> list[Finding]:
    out = []
    for index, gpus in ctx.per_gpu():
        busy = [g for g in gpus if (g.util_gpu or 0) >= 50]
        if len(busy) < max(3, len(gpus) // 2):
            continue
        throttled = [g for g in busy if any(e in THROTTLE_EVENTS for e in g.clock_events)]
        if len(throttled) < len(busy) / 2:
            continue
        clock = _mean(g.sm_clock_mhz for g in throttled)
        max_clock = throttled[-1].sm_clock_max_mhz
        if clock is None or not max_clock or clock > 0.9 * max_clock:
            continue
        lost = 1 - clock / max_clock
        reasons = sorted({e for g in throttled for e in g.clock_events if e in THROTTLE_EVENTS})
        thermal = any("thermal" in r for r in reasons)
        last = throttled[-1]
        power = (f", power {last.power_w:.0f}/{last.power_limit_w:.0f} W"
                 if last.power_w is not None and last.power_limit_w else "")
        temp = f", {last.temperature_c:.0f} C" if last.temperature_c is not None else ""
        out.append(Finding(
            id="throttling",
            severity="critical" if thermal else "warning",
            title=f"GPU {index} clocks held down ({', '.join(reasons)})",
            evidence=(f"SM clock {clock:.0f}/{max_clock:.0f} MHz (-{lost * 100:.0f}%) while busy"
                      f"{power}{temp}; reasons: {', '.join(reasons)}"),
            fix=("Thermal: check the node's cooling and airflow, fan or chassis faults. Power cap: "
                 "check `nvidia-smi -q -d POWER` for a lowered limit (nvidia-smi -pl), or accept it"
                 if thermal else
                 "The board is at its power limit: check `nvidia-smi -q -d POWER` for a lowered "
                 "limit; otherwise this is the GPU's ceiling (mixed precision does more per watt)"),
            next_step=f"nvidia-smi -q -d PERFORMANCE,POWER,TEMPERATURE -i {index}",
            cost_s=lost * WINDOW_S,
            gpu=index,
        ))
    return out


def rule_memory(ctx: _Context) -> list[Finding]:
    out = []
    for index, gpus in ctx.per_gpu():
        last = gpus[-1]
        if not last.mem_total or last.mem_used is None:
            continue
        share = _mean(g.mem_used / g.mem_total for g in gpus if g.mem_used is not None)
        if share is not None and share > 0.9:
            out.append(Finding(
                id="memory-pressure",
                severity="critical" if share > 0.97 else "warning",
                title=f"GPU {index} memory nearly full",
                evidence=f"{share * 100:.1f}% of {_gib(last.mem_total)} in use over {WINDOW_S:.0f} s",
                fix=("Lower the batch size or use gradient accumulation, activation checkpointing, "
                     "mixed precision; set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True "
                     "against fragmentation"),
                next_step=_memory_next_step(gpus, index),
                gpu=index,
            ))
    for index, gpus in ctx.per_gpu():
        fit = ctx.gpus[index].memory
        points = fit.points
        if len(points) < 8 or points[-1][0] - points[0][0] < MEMORY_MIN_S:
            continue
        ts, ys = (points[0][0], points[-1][0]), (points[0][2], points[-1][2])
        slope, r2 = fit.fit()
        total = gpus[-1].mem_total or 0
        rise = ys[-1] - ys[0]
        if slope <= 0 or r2 < 0.9 or not total or rise < 0.01 * total:
            continue
        to_oom = (total - ys[-1]) / slope
        span = ts[-1] - ts[0]
        # Critical only for a rise that has lasted a minute: the caching allocator's first fill
        # also rises steadily for some seconds.
        critical = to_oom < 600 and span >= MEMORY_CRITICAL_S
        full = "" if span >= MEMORY_WINDOW_S - 1 else (
            f" (all {span:.0f} s of history so far; the fit uses up to "
            f"{MEMORY_WINDOW_S / 60:.0f} min)")
        out.append(Finding(
            id="memory-growth",
            severity="critical" if critical else "warning",
            title=f"GPU {index} memory rising steadily",
            evidence=(f"+{_gib(rise)} in {span:.0f} s{full} ({slope / 1024**2:.0f} MiB/s, "
                      f"R²={r2:.2f}); at this rate out of memory in {_duration(to_oom)}"),
            fix=("A leak: tensors kept across steps (losses appended without .item() or "
                 ".detach(), a growing cache, retain_graph=True). Keep scalars, not graphs; "
                 "torch.cuda.memory._record_memory_history() and a snapshot after a few hundred "
                 "steps show the allocation that grows"),
            next_step=_memory_next_step(gpus, index),
            cost_s=span if critical else 0.0,
            gpu=index,
        ))
    return out


def _memory_next_step(gpus: list[GpuSample], index: int) -> str:
    """Record the allocations of the process holding the most memory (through its agent), else
    list who holds what."""
    procs = [p for p in gpus[-1].processes if p.visible]
    if procs:
        top = max(procs, key=lambda p: p.gpu_mem or 0)
        if top.agent:
            return ns.gputop_capture(top.pid) + " --profile-memory"
    return f"nvidia-smi --query-compute-apps=pid,used_memory --format=csv -i {index}"


def rule_pcie(ctx: _Context) -> list[Finding]:
    out = []
    for index, gpus in ctx.per_gpu():
        last = gpus[-1]
        gen, width = last.pcie_gen_max or last.pcie_gen, last.pcie_width_max or last.pcie_width
        if not gen or not width:
            continue
        link_mbs = PCIE_GBS_PER_LANE.get(gen, 1.0) * width * 1000
        rx = _mean(g.pcie_rx_mbs for g in gpus) or 0.0
        tx = _mean(g.pcie_tx_mbs for g in gpus) or 0.0
        util = _mean(g.util_gpu for g in gpus)
        traffic = max(rx, tx)
        if util is None or util >= 70 or traffic < 0.6 * link_mbs:
            continue
        direction = "host to device" if rx >= tx else "device to host"
        out.append(Finding(
            id="pcie-bound",
            severity="warning",
            title=f"GPU {index} waits on PCIe copies",
            evidence=(f"{traffic / 1000:.1f} GB/s {direction} = {traffic / link_mbs * 100:.0f}% of "
                      f"the Gen{gen} x{width} link while the GPU is busy {util:.0f}%"),
            fix=("Send less over the bus: keep data on the GPU across steps, send uint8 images and "
                 "normalise on the GPU, use pin_memory=True with non_blocking=True to overlap copies"),
            next_step=ns.nsys("pcie", app=_relaunch(gpus, _pids(gpus)[0] if _pids(gpus) else None),
                              trace="cuda,osrt") + " && nsys stats --report=cuda_gpu_mem_size_sum,"
                              "cuda_gpu_mem_time_sum pcie.nsys-rep",
            cost_s=(100 - util) / 100 * WINDOW_S,
            gpu=index,
        ))
    return out


def rule_contention(ctx: _Context) -> list[Finding]:
    out = []
    for index, gpus in ctx.per_gpu():
        counts = [len(g.processes) for g in gpus]
        if min(counts) < 2:
            continue
        last = gpus[-1]
        desc = ", ".join(
            f"{p.pid} ({p.name if p.visible else 'not visible'}"
            + (f", {_gib(p.gpu_mem)}" if p.gpu_mem else "") + ")"
            for p in last.processes
        )
        out.append(Finding(
            id="contention",
            severity="warning",
            title=f"GPU {index} shared by {counts[-1]} processes",
            evidence=f"compute processes on GPU {index} for {WINDOW_S:.0f} s: {desc}",
            fix=("Give each job its own GPU (CUDA_VISIBLE_DEVICES), or use MPS / MIG when sharing "
                 "is intended; time-slicing makes every process slower"),
            next_step=f"nvidia-smi --query-compute-apps=pid,used_memory --format=csv -i {index}",
            gpu=index,
        ))
    return out


def rule_imbalance(ctx: _Context) -> list[Finding]:
    """GPUs of one job (ranks of one launcher, or one process on several GPUs) doing unequal work."""
    last = ctx.window[-1] if ctx.window else None
    if last is None:
        return []
    jobs: dict[object, set[int]] = {}
    for gpu in last.gpus:
        if gpu.lost:
            continue
        for proc in gpu.processes:
            job = (proc.agent or {}).get("job_id") or _parent_job(proc, ctx.own_pid)
            jobs.setdefault(job, set()).add(gpu.index)
    out = []
    for job, indices in jobs.items():
        if job is None or len(indices) < 2:
            continue
        series = dict(ctx.per_gpu())
        utils = {i: _mean(g.util_gpu for g in series.get(i, [])) for i in indices}
        utils = {i: u for i, u in utils.items() if u is not None}
        if len(utils) < 2:
            continue
        hi, lo = max(utils.values()), min(utils.values())
        if hi - lo < 25 or lo > 0.75 * hi:
            continue
        slow = min(utils, key=utils.get)
        out.append(Finding(
            id="imbalance",
            severity="warning",
            title=f"GPUs of one job do unequal work (GPU {slow} at {lo:.0f}%)",
            evidence=(f"utilization over {WINDOW_S:.0f} s: "
                      + ", ".join(f"GPU {i} {u:.0f}%" for i, u in sorted(utils.items()))),
            fix=("Find the straggler: uneven data shards or sequence lengths, a rank doing extra "
                 "logging or evaluation, a slower or throttled GPU. Balance the work per rank"),
            next_step=_look_deeper(series.get(slow, []), _first_pid(series.get(slow, []))),
            gpu=slow,
        ))
    return out


def rule_rank_imbalance(ctx: _Context) -> list[Finding]:
    """The ranks of one job side by side, from their agents' step telemetry (``live_ranks``)."""
    return rank_imbalance(jobs_in(ctx.window[-1])) if ctx.window else []


def rule_hardware(ctx: _Context) -> list[Finding]:
    out = []
    for index, gpus in ctx.per_gpu():
        last = gpus[-1]
        if last.lost:
            out.append(Finding(
                id="hardware-errors",
                severity="critical",
                title=f"GPU {index} fell off the bus",
                evidence=f"GPU {index} ({last.name or '?'}, {last.bus_id or '?'}) answers GPU_IS_LOST",
                fix=("The GPU needs a reset or the node a reboot; drain the node and check "
                     "`dmesg | grep -i xid` for the Xid code (79: fallen off the bus)"),
                next_step="dmesg -T | grep -i -E 'xid|nvrm'",
                cost_s=WINDOW_S,
                gpu=index,
            ))
            continue
        counts = [g.ecc_volatile for g in gpus if g.ecc_volatile is not None]
        if counts and counts[-1] > 0 and (counts[-1] > counts[0] or len(counts) >= 3):
            out.append(Finding(
                id="hardware-errors",
                severity="critical" if counts[-1] > counts[0] else "warning",
                title=f"GPU {index} reports ECC errors",
                evidence=f"{counts[-1]} volatile ECC errors (+{counts[-1] - counts[0]} in {WINDOW_S:.0f} s)",
                fix="Rising ECC errors precede failures: drain the node and have the GPU checked",
                next_step=f"nvidia-smi -q -d ECC,ROW_REMAPPER -i {index}",
                gpu=index,
            ))
    return out


def rule_launch_bound(ctx: _Context) -> list[Finding]:
    out = []
    for index, gpus in ctx.per_gpu():
        util = _mean(g.util_gpu for g in gpus)
        sm = _mean(g.sm_active for g in gpus)
        if util is None or sm is None or util < 80 or sm >= 40:
            continue
        pid = gpus[-1].processes[0].pid if gpus[-1].processes else None
        out.append(Finding(
            id="launch-bound",
            severity="warning",
            title=f"GPU {index} busy but its SMs mostly idle",
            evidence=(f"utilization {util:.0f}% (a kernel is running) but SM activity {sm:.0f}% "
                      "(GPM): many tiny kernels, launch overhead dominates"),
            fix=("Fuse the small kernels: torch.compile, CUDA graphs (torch.cuda.graphs or "
                 "mode='reduce-overhead'), larger batches"),
            next_step=_look_deeper(gpus, pid),
            cost_s=(100 - sm) / 100 * WINDOW_S,
            gpu=index,
            pid=pid,
        ))
    return out


RULES = (
    rule_dataloader_stall,
    rule_host_sync,
    rule_gpu_idle,
    rule_hung,
    rule_throttling,
    rule_memory,
    rule_pcie,
    rule_contention,
    rule_imbalance,
    rule_rank_imbalance,
    rule_hardware,
    rule_launch_bound,
    rule_mfu_drop,
)


def _first_pid(gpus: list[GpuSample]) -> int | None:
    pids = _pids(gpus) if gpus else []
    return pids[0] if pids else None


def _pids(gpus: list[GpuSample]) -> list[int]:
    return [p.pid for p in gpus[-1].processes if p.visible]


def _parent_job(proc: ProcSample, own_pid: int) -> object:
    """Without an agent, ranks are grouped by their launcher (torchrun's pid)."""
    parent = proc.ppid
    # gputop's own demo stand-ins are its children, but each is a job of its own.
    if parent in (None, 0, 1, own_pid):
        return None
    return ("ppid", parent)


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def split_by_gpu(history: Iterable[Snapshot]) -> dict[int, tuple[list[float], list[GpuSample]]]:
    """index -> (times, samples) over a history of snapshots."""
    by_gpu: dict[int, tuple[list[float], list[GpuSample]]] = {}
    for s in history:
        for g in s.gpus:
            times, gpus = by_gpu.setdefault(g.index, ([], []))
            times.append(s.time)
            gpus.append(g)
    return by_gpu


# Explanations of why a GPU does less work than it could. One GPU gets at most one at a time,
# the most specific evidence first (no progress at all; a measured or saturated input
# pipeline; a sync saw-tooth with a CPU-bound loop; a saturated link; lowered clocks; idle SMs
# under busy kernels; a shared GPU; an uneven job; idle with nothing else to blame; and last,
# a job slower than its own best window, which any of those explains better).
# The others that held are named in the winner's evidence, not reported beside it.
# memory-pressure, memory-growth and hardware-errors are conditions, not explanations of the
# same symptom, and are reported on their own.
ROOT_CAUSES = ("hung", "dataloader-stall", "host-sync", "pcie-bound", "throttling",
               "launch-bound", "contention", "imbalance", "gpu-idle", "mfu-drop")


def _group(f: Finding) -> object:
    # A job's straggler is the job's root cause, beside whatever holds its GPU.
    if f.id == "imbalance" and f.job is not None:
        return ("job", f.job)
    return f.gpu if f.gpu is not None else ("pid", f.pid)


def arbitrate(found: Iterable[Finding]) -> list[Finding]:
    """One root cause per GPU (see ``ROOT_CAUSES``); the losing candidates become evidence."""
    out: list[Finding] = []
    groups: dict[object, list[Finding]] = {}
    for f in found:
        if f.id in ROOT_CAUSES:
            groups.setdefault(_group(f), []).append(f)
        else:
            out.append(f)
    for cands in groups.values():
        cands.sort(key=lambda f: (ROOT_CAUSES.index(f.id), -f.cost_s))
        win, others = cands[0], [c for c in cands[1:] if c.id != cands[0].id]
        if others:
            names = "; ".join(f"{c.id} ({c.title})" for c in others)
            win = replace(win, evidence=f"{win.evidence}. Also held, explained by this: {names}")
        out.append(win)
    return out


def evaluate(history: list[Snapshot], own_pid: int | None = None) -> list[Finding]:
    """Every finding whose condition holds at the newest snapshot (no hysteresis)."""
    windows = _Windows()
    for snap in history:
        windows.add(snap)
    return _evaluate(windows, own_pid)


def _evaluate(windows: _Windows, own_pid: int | None) -> list[Finding]:
    ctx = windows.context(own_pid)
    if ctx is None:
        return []
    found: list[Finding] = []
    for rule in RULES:
        found.extend(rule(ctx))
    jobs = jobs_in(ctx.window[-1])
    if any(f.id == "imbalance" and f.job is not None for f in found):
        # The agents' step times name the straggler; GPU utilisation only guesses at it.
        found = [f for f in found if f.id != "imbalance" or f.job is not None]
    return order_findings(arbitrate(annotate(found, jobs)))


# -- hysteresis ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Transition:
    state: str  # "raised" | "cleared"
    time: float
    finding: Finding

    def to_json(self, host: str) -> dict:
        data = {"time": self.time, "host": host, "state": self.state, **self.finding.to_json()}
        for key in ("gpu", "pid", "job", "rank"):
            data.setdefault(key, None)
        return data


class LiveDiagnosis:
    """Feed snapshots in time order; get raise/clear transitions and the active findings."""

    def __init__(self, raise_after: float = 4.0, clear_after: float = 10.0,
                 own_pid: int | None = None) -> None:
        self.raise_after = raise_after
        self.clear_after = clear_after
        self.own_pid = own_pid
        # What the rules read, updated one snapshot at a time (no copy of the history).
        self._windows = _Windows()
        self._pending: dict[tuple, float] = {}  # key -> first time the condition held
        self._absent: dict[tuple, float] = {}  # active key -> first time it did not hold
        self.active: dict[tuple, Finding] = {}

    def update(self, snap: Snapshot, evaluate: bool = True) -> list[Transition]:
        """Take ``snap`` into the windows; with ``evaluate``, run the rules on them too (a
        caller may run them less often than it samples: the windows hold every snapshot)."""
        self._windows.add(snap)
        if not evaluate:
            return []
        now = snap.time
        current = {finding_key(f): f for f in _evaluate(self._windows, self.own_pid)}
        transitions: list[Transition] = []
        for key, finding in current.items():
            self._absent.pop(key, None)
            if key in self.active:
                self.active[key] = finding  # fresh evidence
                continue
            since = self._pending.setdefault(key, now)
            if now - since >= self.raise_after:
                if finding.id in ROOT_CAUSES:
                    # A new root cause for this GPU replaces the old one at once: never two.
                    for other_key, other in list(self.active.items()):
                        if other.id in ROOT_CAUSES and _group(other) == _group(finding):
                            transitions.append(Transition("cleared", now, other))
                            del self.active[other_key]
                            self._absent.pop(other_key, None)
                self.active[key] = finding
                del self._pending[key]
                transitions.append(Transition("raised", now, finding))
        for key in list(self._pending):
            if key not in current:
                del self._pending[key]
        for key in list(self.active):
            if key in current:
                continue
            since = self._absent.setdefault(key, now)
            if now - since >= self.clear_after:
                transitions.append(Transition("cleared", now, self.active.pop(key)))
                del self._absent[key]
        return transitions

    def findings(self) -> list[Finding]:
        return order_findings(self.active.values())
