"""Findings ranked by what they cost on this host's GPUs, the user's own first.

The live rules judge every process with an agent, GPU or not: on a shared node that includes
other people's CPU trainers and jobs that hold no GPU here. A finding about such a process
costs this host's GPUs nothing, so it never outranks one on a GPU, or on a process or job
that holds one. At equal cost on the GPUs (findings about processes on no GPU all cost them
nothing) the user's own processes come first.

The same family of processes (``gputop.core.gpu_family``) is what the process table shows by
default. Pure, no textual.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from gputop.core.gpu_family import gpu_family
from gputop.core.job_groups import jobs_in
from gputop.core.model import Snapshot
from gputop.diagnostics.findings import SEVERITY_RANK, Finding

# Tiers, best first.
ON_GPU = 0  # about a GPU, a process on one, or a job that holds one
HOST = 1  # about the host or nothing in particular
NO_GPU = 2  # about a process that holds no GPU here


def _gpu_jobs(snap: Snapshot, family: set[int]) -> set[str]:
    return {job.job_id for job in jobs_in(snap) if job.pids & family}


def tier(f: Finding, family: set[int], gpu_jobs: set[str], pids: set[int]) -> int:
    """``pids``: every process the snapshot names (on a GPU or not)."""
    if f.gpu is not None or (f.job is not None and f.job in gpu_jobs):
        return ON_GPU
    if f.pid is not None:
        if f.pid in family:
            return ON_GPU
        return NO_GPU if f.pid in pids else HOST
    return HOST


def rank_for_host(findings: Iterable[Finding], snap: Snapshot | None,
                  uid: int | None = None) -> list[Finding]:
    """``findings`` most costly on this host's GPUs first; own processes (``uid``, this
    process's real uid by default) before others' at equal cost on the GPUs."""
    findings = list(findings)
    if snap is None:
        return findings
    uid = os.getuid() if uid is None else uid
    family = gpu_family(snap)
    gpu_jobs = _gpu_jobs(snap, family)
    procs = {p.pid: p for g in snap.gpus for p in g.processes}
    procs.update({p.pid: p for p in snap.other_processes})

    def others(f: Finding) -> bool:
        p = procs.get(f.pid) if f.pid is not None else None
        return p is not None and p.uid is not None and p.uid != uid

    def key(f: Finding) -> tuple:
        t = tier(f, family, gpu_jobs, set(procs))
        gpu_cost = f.cost_s if t == ON_GPU else 0.0
        return (t, -gpu_cost, others(f), -f.cost_s, -SEVERITY_RANK[f.severity], f.id)

    return sorted(findings, key=key)
