"""The GPU waits on the host: ``host-bound``, ``launch-bound``, ``host-sync``.

Each follows from what the counters mean (see ``common``):

* ``launch-bound``: SM activity (GPM) a small fraction of the time kernels ran. Utilization
  counts any kernel or copy, SM activity the SM-cycles with a warp resident, averaged over the
  SMs (DCGM: a kernel of N/k blocks on N SMs reads 1/k); kernels that fill the GPU make the two
  about equal (a ResNet-18 at batch 256 on an H200: 100 % and 79 %, at batch 32 ~1/3).
  Under a tenth (``FILL_SMALL``) means kernels of a few blocks each, one launch after another:
  on an H200, 40 tiny layers read 15-21 % utilization and < 1 % SM activity. The copies' share
  (PCIe traffic against the link) comes off utilization first. When the launching thread has
  no slack, every idle SM-cycle is the launch path's.
* ``host-bound``: the GPU mostly idle (over half the time) while the training thread is busy
  with its own code outside the DataLoader and device syncs (the agent's step breakdown;
  without it the process's CPU), and the kernels that do run are not tiny (else it is
  ``launch-bound``). Cost: the GPU's idle time, up to the thread's busy share. A thread that
  spins in CUDA's launch queue or a sync reads busy too, so only a mostly idle GPU counts.
* ``host-sync`` only on positive evidence that the host waits on the device: the agent's timing
  of device syncs (``.item()``, ``.cpu()``, ``torch.cuda.synchronize()``) in each step, or,
  without it, the process seen asleep while its GPU works and running while its GPU idles
  (host and device taking turns: a blocking sync, visible at steps slower than the sampling).
  Its cost is the GPU's idle time up to the time the host waited: without the wait, the host's
  work would overlap the GPU's. The shape of the utilization curve is no evidence: start-up and
  any uneven job make the same saw-tooth.
"""

from __future__ import annotations

from gputop.diagnostics.findings import Finding
from gputop.diagnostics.live.common import (
    SATURATED,
    WARNING_SHARE,
    WINDOW_S,
    look_deeper,
    pct,
    pids,
    severity_for,
)
from gputop.diagnostics.live.load import TreeLoad, load_of
from gputop.diagnostics.live.windows import GpuReadings, _Context

# SM activity under a tenth of the time kernels ran: the kernels average under a tenth of the
# SMs (DCGM's definition: a kernel of N/k blocks on N SMs reads 1/k), a few blocks each.
FILL_SMALL = 0.1
# host-bound: the GPU "mostly idle", more than half the time.
MOSTLY_IDLE = 0.5
KERNELS_MIN = WARNING_SHARE  # kernels must run this share of the time to be judged
# Without the agent: asleep while the GPU works, and running while it idles, in this share of
# the samples each (two samples of a 10 s window at 1 s).
SLEPT_MIN = 0.2


def fill(r: GpuReadings) -> float | None:
    """SM activity against the time kernels ran (1: kernels fill the GPU), or None when GPM
    is not reported or kernels hardly ran."""
    kernels = r.kernels
    if r.sm is None or kernels is None or kernels < KERNELS_MIN:
        return None
    return min(1.0, r.sm / 100.0 / kernels)


def _saturated(load: TreeLoad) -> tuple[float, str] | None:
    """The training thread's busy share and how it is known, when it has no slack."""
    busy, how = load.thread_busy
    if busy is None:
        return None
    if busy >= SATURATED:
        return busy, how
    if how == "cpu" and load.main_runnable >= SATURATED and load.host_cpu >= 90:
        return max(busy, load.main_runnable), "runnable"
    return None


def _thread_text(load: TreeLoad, busy: float, how: str) -> str:
    if how == "agent":
        return (f"the training thread runs its own code {pct(busy)} of each step (agent: "
                f"DataLoader wait {pct(load.wait_share or 0)}, device syncs "
                f"{pct(load.sync_share or 0)})")
    if how == "runnable":
        return (f"its main process wants a CPU {pct(load.main_runnable)} of the time on a host "
                f"with none left ({load.host_cpu:.0f}% busy)")
    waited = (f", less the DataLoader wait the agent times ({pct(load.wait_share)})"
              if load.wait_share is not None and not load.n_workers else "")
    return (f"its main process runs at {load.main_cpu or 0:.0f}% of a core{waited} (no step "
            "breakdown from an agent: data loading in the loop reads the same)")


def rule_host_bound(ctx: _Context) -> list[Finding]:
    out = []
    for index, gpus in ctx.per_gpu():
        r = ctx.readings(index, gpus)
        if r.util is None or r.idle < MOSTLY_IDLE:
            continue
        filled = fill(r)
        if filled is not None and filled < FILL_SMALL:
            continue  # small kernels: launch-bound
        for pid in pids(gpus):
            load = load_of(ctx, index, gpus, pid)
            found = _saturated(load)
            if found is None:
                continue
            busy, how = found
            share = min(r.idle, busy)
            if share < WARNING_SHARE:
                continue
            sm = (f"; SM activity {r.sm:.0f}% ({pct(filled)} of the SM-time while kernels run): "
                  "the kernels are not tiny, the GPU waits for the host to send them"
                  if filled is not None else
                  "; no SM activity (GPM) from this GPU: launch overhead cannot be told "
                  "apart from Python" if r.sm is None else "")
            out.append(Finding(
                id="host-bound",
                severity=severity_for(share),
                title=f"GPU {index} waits on the host code of pid {pid}",
                evidence=(f"GPU {index} idle {pct(r.idle)} over {WINDOW_S:.0f} s (utilization "
                          f"{r.util:.0f}%, kernels and copies) while "
                          f"{_thread_text(load, busy, how)}{sm}"),
                fix=("Take per-step Python off the training thread or do it every N steps "
                     "(logging, metrics, bookkeeping); turn Python loops over tensors into "
                     "tensor ops; torch.compile / CUDA graphs shorten the launch path; if the "
                     "loop loads data itself (num_workers=0), use DataLoader workers"),
                next_step=look_deeper(gpus, pid),
                cost_s=share * WINDOW_S,
                gpu=index,
                pid=pid,
            ))
    return out


def rule_launch_bound(ctx: _Context) -> list[Finding]:
    out = []
    for index, gpus in ctx.per_gpu():
        r = ctx.readings(index, gpus)
        filled = fill(r)
        if filled is None or filled >= FILL_SMALL:
            continue
        pid = next(iter(pids(gpus)), None)
        load = load_of(ctx, index, gpus, pid) if pid is not None else None
        found = _saturated(load) if load is not None else None
        sm = (r.sm or 0.0) / 100.0
        kernels = r.kernels or 0.0
        if found is not None:
            share = 1.0 - sm  # the launching thread is the limit: every idle SM-cycle
            thread = f"; {_thread_text(load, *found)}: it cannot launch faster"
        else:
            share = kernels - sm
            thread = ""
        if share < WARNING_SHARE:
            continue
        copies = f", {pct(r.bus)} of it copies" if r.bus and r.bus >= 0.01 else ""
        out.append(Finding(
            id="launch-bound",
            severity=severity_for(share),
            title=f"GPU {index} runs kernels too small to fill it",
            evidence=(f"utilization {r.util:.0f}% (a kernel or copy ran{copies}) but SM activity "
                      f"{r.sm:.0f}% (GPM): while kernels run, {pct(filled)} of the SM-time is "
                      f"used: many tiny kernels, launch overhead dominates{thread}"),
            fix=("Fuse the small kernels: torch.compile, CUDA graphs (torch.cuda.graphs or "
                 "mode='reduce-overhead'), larger batches"),
            next_step=look_deeper(gpus, pid),
            cost_s=share * WINDOW_S,
            gpu=index,
            pid=pid,
        ))
    return out


def rule_host_sync(ctx: _Context) -> list[Finding]:
    out = []
    for index, gpus in ctx.per_gpu():
        r = ctx.readings(index, gpus)
        if r.util is None:
            continue
        for pid in pids(gpus):
            load = load_of(ctx, index, gpus, pid)
            if load.sync_share is not None:
                share = min(r.idle, load.sync_share)
                if load.sync_share < WARNING_SHARE:
                    continue
                why = (f"the agent times the training thread waiting on the device (.item(), "
                       f".cpu(), synchronize) {pct(load.sync_share)} of each step, and GPU "
                       f"{index} idles {pct(r.idle)} (utilization {r.util:.0f}%) while the "
                       "host works between syncs")
            elif (load.slept_while_busy is not None and load.ran_while_idle is not None
                  and load.slept_while_busy >= SLEPT_MIN):
                share = min(r.idle, load.ran_while_idle)
                why = (f"its main thread sleeps in {pct(load.slept_while_busy)} of the samples "
                       f"while GPU {index} works and runs in {pct(load.ran_while_idle)} while "
                       "it idles: host and device take turns, the host blocked on the device "
                       "(a blocking sync)")
            else:
                continue
            if share < WARNING_SHARE:
                continue
            out.append(Finding(
                id="host-sync",
                severity=severity_for(share),
                title=f"pid {pid} blocks on GPU {index} every step",
                evidence=why,
                fix=("Remove per-step .item() / .cpu() / print(loss) / torch.cuda.synchronize() "
                     "from the loop; accumulate metrics on the GPU and read them every N steps"),
                next_step=look_deeper(gpus, pid),
                cost_s=share * WINDOW_S,
                gpu=index,
                pid=pid,
            ))
    return out
