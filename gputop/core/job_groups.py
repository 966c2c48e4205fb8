"""The ranks of each distributed job in one snapshot, from what their agents report.

Every agent says its rank, local rank, world size and job id (``gputop.agent.info``); the
processes that share a job id are one job. A job row in the process table, the ``jobs`` list
of ``snapshot --json`` and the cross-rank live rule all read this view. What an agent reports
is untrusted: numbers are type-checked, the job id is bounded and escaped.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gputop.core.format import safe_text

if TYPE_CHECKING:
    from gputop.core.model import Efficiency, ProcSample, Snapshot

MAX_JOB_ID = 200


@dataclass(frozen=True)
class RankView:
    rank: int
    pid: int
    local_rank: int | None
    gpus: tuple[int, ...]  # the GPUs NVML reports it on; () for a CPU (gloo) rank
    steps: int
    steps_per_s: float | None
    step_time_p50_s: float | None
    dataloader_wait_share: float | None  # 0-1 of its step time
    efficiency: Efficiency | None = None  # MFU, goodput, J/step (gputop.core.efficiency)

    @property
    def gpu(self) -> int | None:
        return self.gpus[0] if self.gpus else None

    def to_json(self) -> dict[str, Any]:
        return {"rank": self.rank, "local_rank": self.local_rank, "pid": self.pid,
                "gpus": list(self.gpus), "steps": self.steps, "steps_per_s": self.steps_per_s,
                "step_time_p50_s": self.step_time_p50_s,
                "dataloader_wait_share": self.dataloader_wait_share,
                "mfu": self.efficiency.mfu if self.efficiency else None,
                "goodput": self.efficiency.goodput if self.efficiency else None,
                "j_per_step": self.efficiency.j_per_step if self.efficiency else None}


@dataclass(frozen=True)
class JobView:
    job_id: str
    world_size: int | None
    launcher_pid: int | None  # the ranks' common parent (torchrun), when they share one
    ranks: tuple[RankView, ...]
    # Local ranks that no agent answers for (another pid namespace, or exited): named.
    missing_local_ranks: tuple[int, ...] = field(default=())

    @property
    def pids(self) -> set[int]:
        return {r.pid for r in self.ranks}

    def to_json(self) -> dict[str, Any]:
        from gputop.core.efficiency import job_figures

        return {"job_id": self.job_id, "world_size": self.world_size,
                "launcher_pid": self.launcher_pid, "ranks": [r.to_json() for r in self.ranks],
                "missing_local_ranks": list(self.missing_local_ranks),
                "efficiency": job_figures((r.efficiency, r.gpus) for r in self.ranks)}


def jobs_in(snap: Snapshot) -> list[JobView]:
    """The distributed jobs among the snapshot's processes (two or more ranks, or one rank of a
    larger world), ordered by job id."""
    procs: dict[int, tuple[ProcSample, list[int]]] = {}
    for gpu in snap.gpus:
        for p in gpu.processes:
            procs.setdefault(p.pid, (p, []))[1].append(gpu.index)
    for p in snap.other_processes:
        procs.setdefault(p.pid, (p, []))
    grouped: dict[str, list[tuple[RankView, ProcSample, int | None]]] = {}
    for proc, gpus in procs.values():
        # The agent's figures were checked where they were read (core/agent_status.py).
        agent = proc.agent
        if agent is None or not agent.job_id or agent.rank is None:
            continue
        view = RankView(
            rank=agent.rank, pid=proc.pid, local_rank=agent.local_rank,
            gpus=tuple(sorted(gpus)), steps=agent.steps or 0,
            steps_per_s=agent.steps_per_s, step_time_p50_s=agent.step_time_p50_s,
            dataloader_wait_share=agent.dataloader_wait_share,
            efficiency=proc.efficiency,
        )
        grouped.setdefault(safe_text(agent.job_id[:MAX_JOB_ID]), []).append(
            (view, proc, agent.local_world_size))
    out = []
    for job_id, members in sorted(grouped.items()):
        ranks = tuple(sorted((m[0] for m in members), key=lambda r: (r.rank, r.pid)))
        worlds = {w for m in members if m[1].agent and (w := m[1].agent.world_size)}
        world = max(worlds) if worlds else None
        if len(ranks) < 2 and not (world and world > 1):
            continue
        parents = {m[1].ppid for m in members}
        local = max((m[2] for m in members if m[2]), default=None)
        seen = {r.local_rank for r in ranks}
        missing = tuple(lr for lr in range(local or 0) if lr not in seen) if local else ()
        out.append(JobView(job_id, world, parents.pop() if len(parents) == 1 else None, ranks,
                           missing if local and local <= 1024 else ()))
    return out
