"""GPUs shared or unequal: ``contention`` and ``imbalance``.

Contention: two or more compute processes on one GPU for a whole window (time-slicing makes
each slower). Imbalance: the GPUs of one job (ranks of one launcher, or the agents' job id)
differ in utilization by 25 points and more, the slow one under 3/4 of the fast; the agents'
step telemetry, where the ranks have agents, names the straggler instead (``live.ranks``).
"""

from __future__ import annotations

from gputop.core.job_groups import jobs_in
from gputop.core.model import ProcSample
from gputop.diagnostics.findings import Finding
from gputop.diagnostics.live.common import WINDOW_S, first_pid, gib, look_deeper, mean
from gputop.diagnostics.live.ranks import rank_imbalance
from gputop.diagnostics.live.windows import _Context


def rule_contention(ctx: _Context) -> list[Finding]:
    out = []
    for index, gpus in ctx.per_gpu():
        counts = [len(g.processes) for g in gpus]
        if min(counts) < 2:
            continue
        last = gpus[-1]
        desc = ", ".join(
            f"{p.pid} ({p.name if p.visible else 'not visible'}"
            + (f", {gib(p.gpu_mem)}" if p.gpu_mem else "") + ")"
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
            job = (proc.agent.job_id if proc.agent else None) or _parent_job(proc, ctx.own_pid)
            jobs.setdefault(job, set()).add(gpu.index)
    out = []
    for job, indices in jobs.items():
        if job is None or len(indices) < 2:
            continue
        series = dict(ctx.per_gpu())
        utils = {i: mean(g.util_gpu for g in series.get(i, [])) for i in indices}
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
            next_step=look_deeper(series.get(slow, []), first_pid(series.get(slow, []))),
            gpu=slow,
        ))
    return out


def rule_rank_imbalance(ctx: _Context) -> list[Finding]:
    """The ranks of one job side by side, from their agents' step telemetry (``live.ranks``)."""
    return rank_imbalance(jobs_in(ctx.window[-1])) if ctx.window else []


def _parent_job(proc: ProcSample, own_pid: int) -> object:
    """Without an agent, ranks are grouped by their launcher (torchrun's pid)."""
    parent = proc.ppid
    # gputop's own demo stand-ins are its children, but each is a job of its own.
    if parent in (None, 0, 1, own_pid):
        return None
    return ("ppid", parent)
