"""A GPU with nothing to do: ``gpu-idle`` and ``hung``.

``gpu-idle``: a GPU held (its memory allocated by a process) but busy under 5 % of a window
while its processes hardly use a CPU either: the job waits on something that is neither GPU nor
CPU work (storage, network, a peer, a lock). A CPU-starved process on a saturated host is
runnable most of the time and is not counted as waiting. ``hung``: no GPU work for a minute and
no step progress (when an agent counts steps).
"""

from __future__ import annotations

from collections.abc import Mapping

from gputop.diagnostics import next_steps as ns
from gputop.diagnostics.findings import Finding
from gputop.diagnostics.live.common import HUNG_S, WINDOW_S, gib, mean
from gputop.diagnostics.live.load import load_of
from gputop.diagnostics.live.windows import _Context


def rule_gpu_idle(ctx: _Context) -> list[Finding]:
    out = []
    for index, gpus in ctx.per_gpu():
        last = gpus[-1]
        util = ctx.readings(index, gpus).util
        if util is None or util >= 5 or not last.mem_total or last.mem_used is None:
            continue
        if last.mem_used < 0.05 * last.mem_total or not last.processes:
            continue  # nothing holds the GPU: free, not idle
        tree_cpu = mean(p.tree_cpu_percent for g in gpus for p in g.processes if p.visible)
        if tree_cpu is not None and tree_cpu >= 20:
            continue  # the CPU is working: another rule's business
        # On a saturated host a CPU-bound process gets little CPU time but is runnable all
        # the time: it is starved of CPU, not waiting on I/O (the input-pipeline rule's case).
        loads = [load_of(ctx, index, gpus, p.pid) for p in last.processes if p.visible]
        if any(ld.main_runnable >= 0.5 or ld.worker_runnable >= 0.5 for ld in loads):
            continue
        pids = ", ".join(str(p.pid) for p in last.processes)
        out.append(Finding(
            id="gpu-idle",
            severity="warning",
            title=f"GPU {index} held but idle",
            evidence=(f"GPU {index} busy {util:.0f}% over {WINDOW_S:.0f} s with {gib(last.mem_used)} "
                      f"allocated by pid {pids}; their CPU use {tree_cpu or 0:.0f}%"),
            fix=("The job waits on something that is neither GPU nor CPU work: storage or "
                 "network I/O, a peer rank, a lock; the Python stack shows where it waits"),
            next_step=ns.pyspy_dump(last.processes[0].pid),
            cost_s=WINDOW_S,
            gpu=index,
            pid=last.processes[0].pid,
        ))
    return out


def _steps_in(samples: list[tuple[float, Mapping[int, object]]], pid: int
              ) -> tuple[object, object] | None:
    """The agent's step counts of ``pid`` at the start and at the end of ``samples`` (the
    first and the last reported), found from both ends: no walk over a busy minute."""
    def steps(items):
        for _, by_pid in items:
            value = by_pid.get(pid)
            if value is not None:
                return value
        return None

    first = steps(samples)
    return None if first is None else (first, steps(reversed(samples)))


def rule_hung(ctx: _Context) -> list[Finding]:
    out = []
    for index, state in ctx.gpus.items():
        if ctx.now - state.since < HUNG_S:
            continue  # not watched a minute since its start-up yet
        last = state.window[-1][1]
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
