"""Live cross-rank rule: the agents' step telemetry of one job's ranks, side by side.

Ranks of a data-parallel job run in lockstep: every step ends in collectives that finish only
when the last rank joins, so all ranks show the same step rate and the slow one cannot be told
from its steps/s. What differs is where each rank spends the step: the rank whose DataLoader
wait (timed by its agent) exceeds the others' arrives late at every collective, and the others
spend that difference waiting inside it. Ranks that are not in lockstep (no collective ties
them each step) show it as a slower step time instead. Either way the rank that costs the others
the most time per step is named, with its GPU, as ``imbalance`` for the job; the same severity
scale as every rule (share of the step lost: 5 % warning, 25 % critical).

Pure: reads ``JobView`` (``gputop.core.job_groups``), no I/O.
"""

from __future__ import annotations

from dataclasses import replace

from gputop.core.job_groups import JobView, RankView
from gputop.diagnostics import next_steps as ns
from gputop.diagnostics.findings import WARNING_SHARE, Finding, severity_for
from gputop.diagnostics.live.common import median

# The agent's figures describe its last steps; a rank needs a few timed steps before it is
# compared (the first steps are start-up: compilation, allocator, cuDNN autotune).
MIN_STEPS = 5
WINDOW_S = 10.0  # the cost is expressed over the live rules' window, as theirs is


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.0f} ms" if seconds >= 0.01 else f"{seconds * 1e3:.1f} ms"


def _label(r: RankView) -> str:
    where = f"GPU {r.gpu}" if r.gpu is not None else "CPU"
    return f"rank {r.rank} (pid {r.pid}, {where})"


def _lateness(r: RankView, others: list[RankView]) -> tuple[float, str]:
    """Seconds per step this rank makes the others wait, and why (its DataLoader, or slower
    steps)."""
    step = r.step_time_p50_s or 0.0
    wait = 0.0
    if r.dataloader_wait_share is not None:
        other_waits = [o.dataloader_wait_share for o in others
                       if o.dataloader_wait_share is not None]
        if other_waits:
            wait = (r.dataloader_wait_share - median(other_waits)) * step
    slower = step - median(o.step_time_p50_s or 0.0 for o in others)
    if wait >= slower:
        return wait, "dataloader-stall"
    return slower, "slower steps"


def rank_imbalance(jobs: list[JobView]) -> list[Finding]:
    """One ``imbalance`` finding per job whose straggler costs the others >= 5 % of a step."""
    out = []
    for job in jobs:
        timed = [r for r in job.ranks if r.steps >= MIN_STEPS and r.step_time_p50_s]
        if len(timed) < 2:
            continue
        late = {r.pid: _lateness(r, [o for o in timed if o is not r]) for r in timed}
        worst = max(timed, key=lambda r: late[r.pid][0])
        lost, cause = late[worst.pid]
        step = median(r.step_time_p50_s for r in timed)
        share = lost / step if step else 0.0
        if share < WARNING_SHARE:
            continue
        others = [r for r in timed if r is not worst]
        waits = ", ".join(
            f"rank {r.rank} {r.dataloader_wait_share * 100:.0f}%"
            for r in timed if r.dataloader_wait_share is not None)
        steps = ", ".join(f"rank {r.rank} {_ms(r.step_time_p50_s)}" for r in timed)
        if cause == "dataloader-stall":
            why = (f"its training loop waits for its DataLoader {worst.dataloader_wait_share * 100:.0f}% "
                   f"of each step, the others' median "
                   f"{median(o.dataloader_wait_share or 0.0 for o in others) * 100:.0f}%: "
                   "it reaches every collective late and the others wait there")
            fix = (f"Speed up rank {worst.rank}'s input pipeline (its shard: slower storage, "
                   "longer samples, fewer DataLoader workers than the others?); even out the "
                   "work per rank (DistributedSampler, length-grouped batches)")
        else:
            why = (f"its steps take {_ms(worst.step_time_p50_s)}, the others' median "
                   f"{_ms(median(o.step_time_p50_s for o in others))}")
            fix = (f"Check {'GPU ' + str(worst.gpu) if worst.gpu is not None else 'the host'} "
                   f"of rank {worst.rank} for throttling or other processes; even out the work "
                   "per rank")
        out.append(Finding(
            id="imbalance",
            severity=severity_for(share),
            title=(f"rank {worst.rank} holds job {job.job_id} back ({cause}): the other "
                   f"{len(others)} rank(s) lose ~{_ms(lost)} per step waiting for it"),
            evidence=(f"{_label(worst)}: {why}. DataLoader wait per rank: {waits or 'n/a'}; "
                      f"step time (p50): {steps}."),
            fix=fix,
            next_step=ns.gputop_capture(worst.pid, job=True),
            cost_s=share * WINDOW_S,
            gpu=worst.gpu,
            pid=worst.pid,
            job=job.job_id,
            rank=worst.rank,
        ))
    return out


def annotate(findings: list[Finding], jobs: list[JobView]) -> list[Finding]:
    """Findings about a rank's process, or about a GPU that one rank uses, carry the job and
    the rank (``watch --json`` and the exporter label them with it)."""
    if not jobs:
        return findings
    by_pid = {r.pid: (j.job_id, r.rank) for j in jobs for r in j.ranks}
    by_gpu: dict[int, list[tuple[str, int]]] = {}
    for j in jobs:
        for r in j.ranks:
            for g in r.gpus:
                by_gpu.setdefault(g, []).append((j.job_id, r.rank))
    out = []
    for f in findings:
        owner = by_pid.get(f.pid) if f.pid is not None else None
        if owner is None and f.gpu is not None and len(by_gpu.get(f.gpu, ())) == 1:
            owner = by_gpu[f.gpu][0]
        if owner is not None and f.job is None:
            f = replace(f, job=owner[0], rank=owner[1])
        out.append(f)
    return out
