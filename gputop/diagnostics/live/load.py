"""How busy one training process was over the window, and where its training thread spent each
step: one pass over the window per process (several rules ask for it).

From outside (psutil): the CPU % of the process and of its DataLoader workers, and the share of
samples in which each was runnable (state R: running or waiting for a CPU). A CPU-bound process
on an oversubscribed host gets less than a core, so its CPU % understates how busy it is, but it
is runnable whenever it is not given the CPU; one /proc read per tick is an instant, so over a
window this estimates the share of time it wanted a CPU.

From the agent (``gputop run``), per step of the training thread: the wait in the DataLoader's
``__next__``, the wait in device syncs (``.item()``, ``.cpu()``, ``torch.cuda.synchronize()``:
the host waiting on the device) and the CPU time it spent on its own code outside both (Python,
operator dispatch, kernel launches). Agents of older gputop versions report the first only.
"""

from __future__ import annotations

from dataclasses import dataclass

from gputop.core.model import GpuSample
from gputop.diagnostics.live.common import agent_share, agent_steps, mean

# A GPU "works" in a sample at half its capacity or more, and "idles" under 15 %: the two
# ends of the saw-tooth a host that waits on the device makes at slow steps.
BUSY_UTIL = 50.0
IDLE_UTIL = 15.0


@dataclass(frozen=True)
class TreeLoad:
    """One training process and its DataLoader workers over the window."""

    main_cpu: float | None
    main_runnable: float
    n_workers: int
    worker_cpu: float | None
    worker_runnable: float
    host_cpu: float
    has_agent: bool
    steps: int | None
    wait_share: float | None  # DataLoader wait, share of the step (agent)
    sync_share: float | None  # device syncs, share of the step (agent)
    busy_share: float | None  # CPU on its own code outside both (agent)
    # The process's state against its GPU's, per sample (psutil; None without states): the
    # share of samples in which it slept while its GPU worked, and ran while its GPU idled.
    slept_while_busy: float | None
    ran_while_idle: float | None
    gpu_idle_samples: float | None

    @property
    def thread_busy(self) -> tuple[float | None, str]:
        """The share of the time the training thread ran its own code, and how that is known:
        the agent's timing, else the process's CPU (one core's worth) less the DataLoader wait
        the agent timed (with no workers, loading runs in that thread too)."""
        if self.busy_share is not None:
            return self.busy_share, "agent"
        if self.main_cpu is None:
            return None, "unknown"
        busy = min(1.0, self.main_cpu / 100.0)
        if self.wait_share is not None and not self.n_workers:
            busy = max(0.0, busy - self.wait_share)
        return busy, "cpu"


def tree_load(gpus: list[GpuSample], pid: int, host_cpu: float) -> TreeLoad:
    main_cpu: list[float] = []
    worker_cpu: list[float] = []
    waits: list[float] = []
    syncs: list[float] = []
    busies: list[float] = []
    main_states = main_running = worker_states = worker_running = 0
    slept_busy = ran_idle = idle_states = 0
    last = None
    steps = None
    for g in gpus:
        for p in g.processes:
            if p.pid != pid:
                continue
            last = p
            if p.cpu_percent is not None and p.cpu_percent == p.cpu_percent:
                main_cpu.append(p.cpu_percent)
            if p.state:
                main_states += 1
                running = p.state == "running"
                main_running += running
                util = g.util_gpu
                if util is not None and util == util:
                    slept_busy += util >= BUSY_UTIL and p.state in ("sleeping", "disk-sleep")
                    idle = util < IDLE_UTIL
                    idle_states += idle
                    ran_idle += idle and running
            if p.agent:
                for values, key in ((waits, "dataloader_wait_share"),
                                    (syncs, "sync_wait_share"), (busies, "host_busy_share")):
                    share = agent_share(p, key)
                    if share is not None:
                        values.append(share)
                counted = agent_steps(p)
                steps = counted if counted is not None else steps
            for w in p.workers:
                if w.cpu_percent is not None and w.cpu_percent == w.cpu_percent:
                    worker_cpu.append(w.cpu_percent)
                if w.state:
                    worker_states += 1
                    worker_running += w.state == "running"
    return TreeLoad(
        main_cpu=mean(main_cpu),
        main_runnable=main_running / main_states if main_states else 0.0,
        n_workers=len(last.workers) if last is not None else 0,
        worker_cpu=mean(worker_cpu),
        worker_runnable=worker_running / worker_states if worker_states else 0.0,
        host_cpu=host_cpu,
        has_agent=bool(last is not None and last.agent),
        steps=steps,
        wait_share=mean(waits),
        sync_share=mean(syncs),
        busy_share=mean(busies),
        slept_while_busy=slept_busy / main_states if main_states else None,
        ran_while_idle=ran_idle / main_states if main_states else None,
        gpu_idle_samples=idle_states / main_states if main_states else None,
    )


def load_of(ctx, index: int, gpus: list[GpuSample], pid: int) -> TreeLoad:
    """``tree_load`` once per (GPU, process) and evaluation."""
    key = (index, pid)
    found = ctx.loads.get(key)
    if found is None:
        found = ctx.loads[key] = tree_load(gpus, pid, ctx.host_cpu())
    return found

