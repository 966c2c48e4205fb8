"""A job whose ranks stopped stepping: ``hang``, and ``rank-exited`` when one rank is gone.

Every rank's agent reports how long ago its last optimizer step ended (``last_step_age_s``)
and its typical step time (``step_time_p95_s``, over its recent steps). A job hangs when no
rank of it has stepped for the bound::

    bound = max(10 x the slowest rank's p95 step time, GPUTOP_HANG_MIN_S (default 60 s))

* a slow step is not a hang: steps still end (the bound grows with the job's own step time);
* a job-wide long thing is not a hang: while any rank is inside ``torch.save`` (its agent
  reports ``checkpoint_s``), the others wait for it at their next collective by design; the
  bound then counts from ``CHECKPOINT_MAX_S`` into the save (a write stuck for half an hour is
  a hang, named as such);
* ``rank-exited``: a local rank seen before has no process any more and the rest stopped
  stepping; a rank whose process is alive but whose agent stopped answering (it holds the GIL)
  is named in the ``hang`` finding.

Evidence is what NVML and psutil read at that moment, per rank: a GPU busy with little SM
activity is a communication kernel spinning in a collective; an idle GPU (or a CPU rank at
~0 % CPU) is a rank waiting, stuck in Python or in I/O; a rank at ~100 % of a core spins in its
own code. Which rank never reached which collective is the attribution's job: ``gputop hang
PID`` (``h`` in the monitor) reads every rank's Flight Recorder and stack.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from gputop.core.job_groups import JobView, jobs_in
from gputop.core.model import ProcSample, Snapshot
from gputop.diagnostics.findings import Finding

MIN_ENV = "GPUTOP_HANG_MIN_S"
MIN_S = 60.0  # the bound's floor (GPUTOP_HANG_MIN_S overrides it)
P95_FACTOR = 10.0
CHECKPOINT_MAX_S = 1800.0  # a torch.save this long is itself the hang
_LIVE_SKEW_S = 30.0  # a snapshot this close to now is live: /proc tells exited from quiet


def min_bound_s() -> float:
    """The bound's floor: GPUTOP_HANG_MIN_S when set to a positive number, else 60 s."""
    raw = os.environ.get(MIN_ENV, "").strip()
    try:
        value = float(raw)
    except ValueError:
        return MIN_S
    return value if 0 < value < 1e7 else MIN_S


def bound_s(p95s: list[float]) -> float:
    """No step for this long is a hang (see the module's docstring)."""
    return max(P95_FACTOR * max(p95s, default=0.0), min_bound_s())


@dataclass
class RankMemory:
    """The pid of every (job, local rank) seen, kept across ticks: a rank that is no longer in
    the snapshot is named with its pid (exited, or its agent stopped answering)."""

    pids: dict[tuple[str, int], tuple[int, int]] = field(default_factory=dict)  # -> (pid, rank)

    def update(self, snap: Snapshot) -> None:
        jobs = jobs_in(snap)
        live = {j.job_id for j in jobs}
        for key in [k for k in self.pids if k[0] not in live]:
            del self.pids[key]  # the job is gone: forget it
        for job in jobs:
            for r in job.ranks:
                if r.local_rank is not None:
                    self.pids[(job.job_id, r.local_rank)] = (r.pid, r.rank)
        if len(self.pids) > 65536:  # bounded whatever the agents say
            self.pids.clear()


def _procs(snap: Snapshot) -> dict[int, ProcSample]:
    out = {p.pid: p for g in snap.gpus for p in g.processes}
    for p in snap.other_processes:
        out.setdefault(p.pid, p)
    return out


def _gone(pid: int, snap_time: float, now: float) -> bool | None:
    """True when the process is gone, False when it is alive, None when this cannot be told
    (a recording replayed: its pids are not this machine's now)."""
    if now and abs(now - snap_time) > _LIVE_SKEW_S:
        return None
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state in (b"Z", b"X")  # a zombie its launcher has not reaped is gone too


def _rank_evidence(rank: int, pid: int, proc: ProcSample | None, gpu_util: dict[int, tuple]) -> str:
    if proc is None:
        return f"rank {rank} (pid {pid})"
    gpus = sorted({g for g, pids in gpu_util.items() if pid in pids[2]})
    if gpus:
        util, sm = gpu_util[gpus[0]][:2]
        if util is None:
            what = f"GPU {gpus[0]}"
        elif util >= 50 and sm is not None and sm < 20:
            what = (f"GPU {gpus[0]} busy {util:.0f}% with SM activity {sm:.0f}%: a "
                    "communication kernel spinning in a collective")
        elif util < 5:
            what = f"GPU {gpus[0]} idle ({util:.0f}%): the rank is stuck outside the GPU"
        else:
            what = f"GPU {gpus[0]} busy {util:.0f}%" + (f", SM {sm:.0f}%" if sm is not None else "")
    else:
        cpu = proc.cpu_percent
        if cpu is None:
            what = "CPU rank"
        elif cpu >= 80:
            what = f"CPU {cpu:.0f}%: spinning in its own code"
        else:
            what = f"CPU {cpu:.0f}%: waiting"
    return f"rank {rank} (pid {pid}, {what})"


def _job_finding(job: JobView, snap: Snapshot, memory: RankMemory | None,
                 gpu_util: dict[int, tuple]) -> Finding | None:
    procs = _procs(snap)
    ages, p95s, saving = [], [], []
    for r in job.ranks:
        # Checked where they were read (core/agent_status.py): in range or None.
        agent = procs[r.pid].agent if r.pid in procs else None
        age = agent.last_step_age_s if agent is not None else None
        if agent is None or age is None or r.steps < 1:
            return None  # a rank not stepping yet: start-up, not a hang
        ages.append(age)
        p95 = agent.step_time_p95_s
        if p95 is not None:
            p95s.append(p95)
        ckpt = agent.checkpoint_s
        if ckpt is not None:
            saving.append((r.rank, ckpt))
    if not ages:
        return None
    stalled = min(ages)
    bound = bound_s(p95s)
    longest_save = max(saving, key=lambda s: s[1], default=None)
    if longest_save is not None and longest_save[1] < CHECKPOINT_MAX_S:
        return None  # a checkpoint in progress: the others wait for it by design
    if stalled < bound:
        return None
    # Local ranks no agent answers for now: exited, or alive and silent (the GIL held).
    exited, silent = _unanswered(job, memory, snap.time)
    waiting = ", ".join(_rank_evidence(r.rank, r.pid, procs.get(r.pid), gpu_util)
                        for r in job.ranks)
    bound_text = (f"no step for {stalled:.0f} s (the bound: max({P95_FACTOR:.0f} x p95 step "
                  f"{max(p95s, default=0.0):.2f} s, {min_bound_s():.0f} s))")
    first = job.ranks[0]
    hint = f"gputop hang {first.pid}"
    if exited:
        names = ", ".join(_who(rk, pid) for rk, pid in exited)
        return Finding(
            id="rank-exited", severity="critical",
            title=(f"{names} exited; the other {len(job.ranks)} rank(s) of job {job.job_id} "
                   "wait"),
            evidence=(f"{names} has no process any more; {bound_text}; the waiting ranks: "
                      f"{waiting}"),
            fix=("The job cannot go on without that rank: see why it ended (its log, an "
                 "out-of-memory kill in `dmesg`, a crash), then restart from the last "
                 "checkpoint; torchrun's --max-restarts restarts the ranks on its own"),
            next_step=hint, cost_s=stalled, pid=first.pid, job=job.job_id,
            rank=exited[0][0])
    quiet = ""
    if silent:
        quiet = ("; " + ", ".join(_who(rk, pid) for rk, pid in silent)
                 + " is alive but its agent does not answer: it holds the GIL (spinning in "
                 "Python or in a C call), and is the likely cause")
    save = ""
    if longest_save is not None:
        save = f"; rank {longest_save[0]} has been inside torch.save for {longest_save[1]:.0f} s"
    return Finding(
        id="hang", severity="critical",
        title=f"{bound_text.split(' (')[0]}: job {job.job_id} hangs",
        evidence=f"{bound_text}; ranks: {waiting}{quiet}{save}",
        fix=(f"Press h on the job (or run `{hint}`): every rank's Flight Recorder and stack "
             "name the rank that never reached the collective, the collective and the line"),
        next_step=hint, cost_s=stalled, pid=first.pid, job=job.job_id,
        rank=silent[0][0] if silent else None)


def _who(rank: int, pid: int | None) -> str:
    return f"rank {rank} (pid {pid})" if pid else f"rank {rank}"


def _launcher_ranks(launcher: int) -> dict[int, int]:
    """local rank -> pid of the launcher's live children (their environment's LOCAL_RANK)."""
    out: dict[int, int] = {}
    try:
        tids = os.listdir(f"/proc/{launcher}/task")
    except OSError:
        return out
    for tid in tids[:256]:
        try:
            with open(f"/proc/{launcher}/task/{tid}/children", "rb") as f:
                kids = [int(k) for k in f.read().split()[:4096]]
        except (OSError, ValueError):
            continue
        for pid in kids:
            if _gone(pid, 0.0, 0.0):
                continue
            try:
                with open(f"/proc/{pid}/environ", "rb") as f:
                    env = f.read(1 << 20)
            except OSError:
                continue
            for item in env.split(b"\0"):
                if item.startswith(b"LOCAL_RANK=") and item[11:].isdigit():
                    out[int(item[11:])] = pid
    return out


def _unanswered(job: JobView, memory: RankMemory | None, snap_time: float
                ) -> tuple[list[tuple[int, int | None]], list[tuple[int, int | None]]]:
    """(exited, silent): the job's local ranks no agent answers for, as (rank, pid). Told
    apart on a live snapshot only (the launcher's children now, the pids seen before)."""
    if not job.missing_local_ranks:
        return [], []
    live = abs(_wall_now() - snap_time) <= _LIVE_SKEW_S
    children = _launcher_ranks(job.launcher_pid) if live and job.launcher_pid else {}
    offset = next(((r.rank - r.local_rank) for r in job.ranks if r.local_rank is not None), 0)
    exited, silent = [], []
    for local in job.missing_local_ranks:
        seen = memory.pids.get((job.job_id, local)) if memory is not None else None
        rank = seen[1] if seen is not None else offset + local
        if local in children:
            silent.append((rank, children[local]))
        elif seen is not None and live and not _gone(seen[0], snap_time, _wall_now()):
            silent.append((rank, seen[0]))
        elif live and (seen is not None or job.launcher_pid):
            exited.append((rank, seen[0] if seen is not None else None))
    return exited, silent


def _wall_now() -> float:
    import time

    return time.time()


def rule_hang(ctx) -> list[Finding]:  # ctx: gputop.diagnostics.live.windows._Context
    snap = ctx.window[-1]
    jobs = jobs_in(snap)
    if not jobs:
        return []
    gpu_util: dict[int, tuple] = {}
    for index, gpus in ctx.per_gpu():
        readings = ctx.readings(index, gpus)
        gpu_util[index] = (readings.util, readings.sm, {p.pid for p in gpus[-1].processes})
    out = []
    for job in jobs:
        found = _job_finding(job, snap, getattr(ctx, "ranks", None), gpu_util)
        if found is not None:
            out.append(found)
    return out
