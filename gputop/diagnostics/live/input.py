"""The input pipeline: ``dataloader-stall``.

The agent times the training loop's wait in ``DataLoader.__next__`` directly, and that decides
whatever NVML's indirect utilization says; the GPU cannot lose more than it is idle, so the cost
is the smaller of the two. Without the agent, a pipeline is judged by its workers: a DataLoader
worker turns samples into batches, and at >= 60 % of a core on average it has no slack (the
TensorBoard profiler plugin calls a step input-bound when the DataLoader takes >= 5 % of it);
on a host with no CPU left, workers runnable most of the time are starved the same way. A loop
without workers that is CPU-bound could be loading data or running any other Python: without
the agent that is ``host-bound``'s to say.
"""

from __future__ import annotations

from gputop.diagnostics.findings import Finding
from gputop.diagnostics.live.common import (
    WARNING_SHARE,
    WINDOW_S,
    look_deeper,
    pids,
    severity_for,
)
from gputop.diagnostics.live.load import load_of
from gputop.diagnostics.live.windows import _Context

WORKER_SATURATED = 60.0  # % of a core, each worker on average


def rule_dataloader_stall(ctx: _Context) -> list[Finding]:
    out = []
    for index, gpus in ctx.per_gpu():
        util = ctx.readings(index, gpus).util
        if util is None:
            continue
        idle = 1 - util / 100
        for pid in pids(gpus):
            load = load_of(ctx, index, gpus, pid)
            n_workers, worker_cpu = load.n_workers, load.worker_cpu
            wait_share, host_cpu = load.wait_share, load.host_cpu
            if wait_share is not None:
                share = min(wait_share, idle)
                if wait_share < WARNING_SHARE or share < WARNING_SHARE:
                    continue
                why = (f"the agent measures the training loop waiting for the DataLoader "
                       f"{wait_share * 100:.0f}% of each step (NVML: GPU busy {util:.0f}%)")
            elif util >= 50 or not n_workers:
                continue
            elif worker_cpu is not None and worker_cpu >= WORKER_SATURATED:
                share = idle
                why = f"its {n_workers} DataLoader workers run at {worker_cpu:.0f}% of a core each"
            elif load.worker_runnable >= 0.7 and host_cpu >= 90:
                share = idle
                why = (f"its {n_workers} workers are CPU-bound (runnable "
                       f"{load.worker_runnable * 100:.0f}% of the time, {worker_cpu or 0:.0f}% "
                       f"of a core each) on a host with no CPU left ({host_cpu:.0f}% busy)")
            else:
                continue
            out.append(Finding(
                id="dataloader-stall",
                severity=severity_for(share),
                title=f"GPU {index} starved by the input pipeline of pid {pid}",
                evidence=f"GPU {index} busy {util:.0f}% over {WINDOW_S:.0f} s while {why}",
                fix=("Raise DataLoader num_workers (up to the free cores), set pin_memory=True and "
                     "persistent_workers=True, move heavy transforms to the GPU or precompute them"),
                next_step=look_deeper(gpus, pid),
                cost_s=share * WINDOW_S,
                gpu=index,
                pid=pid,
            ))
    return out
