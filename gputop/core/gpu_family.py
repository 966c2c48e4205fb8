"""The processes that are this node's GPU work: those on a GPU and those of a GPU job.

On a shared node the agents answer for other people's CPU trainers too, and for jobs that
hold no GPU here. The process table shows this family by default and the findings about it
rank first (``diagnostics.live.ranking``). Pure: reads a snapshot.
"""

from __future__ import annotations

from gputop.core.job_groups import jobs_in
from gputop.core.model import Snapshot


def gpu_family(snap: Snapshot) -> set[int]:
    """Pids of the processes on a GPU and of those that belong to a GPU job: the other ranks
    of a job one of whose ranks holds a GPU, and a launcher whose child holds one."""
    on_gpu = {p.pid for g in snap.gpus for p in g.processes}
    family = set(on_gpu)
    for job in jobs_in(snap):
        if job.pids & on_gpu:
            family |= job.pids
            if job.launcher_pid:
                family.add(job.launcher_pid)
    parents = {p.ppid for g in snap.gpus for p in g.processes if p.ppid}
    family |= {p.pid for p in snap.other_processes if p.pid in parents}
    return family
