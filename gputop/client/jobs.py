"""Jobs, not single processes: the ranks of one job on this node, and aligned captures of them.

Every agent says its rank, local rank, world size and job id (``gputop.agent.info``). A job is
the agents that share a job id; a pid names it through any of its ranks or through its
launcher (torchrun: the ranks' parent). An aligned capture reads every rank's optimizer-step
count, picks one step a little ahead of all of them, and asks every rank to start recording
at that step: ranks of a data-parallel job step in lockstep, so the traces cover the same
iterations. Each rank writes its trace into one directory for the capture. A rank that does
not answer, or dies on the way, is named; the others' traces are still returned.

Monitor side (blocking): run it in a thread, never on an event loop.
"""

from __future__ import annotations

import math
import os
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gputop.client.agents import (
    AgentError,
    default_capture_dir,
    list_agents,
    request,
    request_capture,
)

# How far ahead of the fastest rank the aligned start is set, in seconds of its steps beyond
# the time since its step count was read: the requests to every rank (a local socket each, sent
# in parallel: milliseconds) must land before any of them reaches that step. A rank that still
# finds its start passed replies `late`; the capture is then armed again once, LEAD_RETRY times
# further ahead (a machine so busy that the requests took that long).
LEAD_S = 0.3
LEAD_RETRY = 5
MIN_LEAD_STEPS = 2
QUERY_TIMEOUT_S = 2.0


@dataclass(frozen=True)
class RankAgent:
    pid: int
    rank: int | None
    local_rank: int | None
    world_size: int | None
    local_world_size: int | None
    job_id: str | None
    ppid: int | None
    steps: int
    steps_per_s: float | None
    dataloader_wait_share: float | None
    argv: tuple[str, ...] = ()


@dataclass
class Job:
    job_id: str
    ranks: list[RankAgent]
    launcher_pid: int | None
    world_size: int | None
    # Local ranks the launcher started on this node that no agent answers for (another pid
    # namespace, or exited): named, not silently dropped.
    unreachable: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "launcher_pid": self.launcher_pid,
            "world_size": self.world_size,
            "ranks": [{"rank": r.rank, "local_rank": r.local_rank, "pid": r.pid,
                       "steps": r.steps, "steps_per_s": r.steps_per_s,
                       "dataloader_wait_share": r.dataloader_wait_share}
                      for r in self.ranks],
            "unreachable": list(self.unreachable),
        }


def _ask(pid: int) -> RankAgent | None:
    try:
        hello = request(pid, {"cmd": "hello"}, QUERY_TIMEOUT_S)
        status = request(pid, {"cmd": "status"}, QUERY_TIMEOUT_S)
    except (AgentError, OSError, ValueError):
        return None

    def num(d: dict, key: str, kind: type) -> Any:
        value = d.get(key)
        return value if isinstance(value, kind) and not isinstance(value, bool) else None

    job = status.get("job_id") if isinstance(status.get("job_id"), str) else None
    argv = hello.get("argv") if isinstance(hello.get("argv"), list) else []
    return RankAgent(
        pid=pid,
        rank=num(status, "rank", int),
        local_rank=num(status, "local_rank", int),
        world_size=num(status, "world_size", int),
        local_world_size=num(status, "local_world_size", int),
        job_id=job[:200] if job else None,
        ppid=num(hello, "ppid", int),
        steps=num(status, "steps", int) or 0,
        steps_per_s=num(status, "steps_per_s", (int, float)),
        dataloader_wait_share=num(status, "dataloader_wait_share", (int, float)),
        argv=tuple(str(a)[:200] for a in argv[:8]),
    )


def agents_on_node() -> list[RankAgent]:
    """Every agent we can reach, asked in parallel."""
    pids = sorted(list_agents())
    found: list[RankAgent | None] = [None] * len(pids)

    def ask(i: int) -> None:
        found[i] = _ask(pids[i])

    threads = [threading.Thread(target=ask, args=(i,), daemon=True) for i in range(len(pids))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(2 * QUERY_TIMEOUT_S + 1)
    return [a for a in found if a is not None]


def group_jobs(agents: list[RankAgent]) -> dict[str, list[RankAgent]]:
    """Ranks by job id (agents without a rank are launchers or single processes)."""
    jobs: dict[str, list[RankAgent]] = {}
    for a in agents:
        if a.rank is not None and a.job_id:
            jobs.setdefault(a.job_id, []).append(a)
    for ranks in jobs.values():
        ranks.sort(key=lambda a: (a.rank, a.pid))
    return jobs


def find_job(pid: int, agents: list[RankAgent] | None = None) -> Job:
    """The job ``pid`` belongs to: a rank of it, or its launcher. AgentError when none."""
    agents = agents_on_node() if agents is None else agents
    by_pid = {a.pid: a for a in agents}
    jobs = group_jobs(agents)
    me = by_pid.get(pid)
    job_id = me.job_id if me is not None and me.rank is not None else None
    if job_id is None:
        # A launcher: the job whose ranks it started.
        children = [a for a in agents if a.ppid == pid and a.rank is not None and a.job_id]
        if children:
            job_id = children[0].job_id
    if job_id is None or job_id not in jobs:
        if me is not None:
            raise AgentError(f"pid {pid} is not a rank of a distributed job (no rank in its "
                             "environment); use `gputop capture PID` for one process", "no-job")
        raise AgentError(f"no ranks of a job found for pid {pid}: neither a rank with the gputop "
                         "agent nor the launcher of some (start the job with `gputop run -- "
                         "torchrun ...`)", "no-job")
    ranks = jobs[job_id]
    parents = {a.ppid for a in ranks}
    launcher = parents.pop() if len(parents) == 1 else None
    world = max((a.world_size for a in ranks if a.world_size), default=None)
    local = max((a.local_world_size for a in ranks if a.local_world_size), default=None)
    unreachable = []
    if local:
        seen = {a.local_rank for a in ranks}
        unreachable = [f"local rank {lr}: no agent answers (another pid namespace, or it "
                       "exited)" for lr in range(local) if lr not in seen]
    return Job(job_id, ranks, launcher, world, unreachable)


@dataclass
class RankCapture:
    agent: RankAgent
    reply: dict[str, Any] | None = None
    error: str | None = None
    code: str | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"rank": self.agent.rank, "pid": self.agent.pid,
                               "ok": self.reply is not None}
        if self.reply is not None:
            out["trace"] = self.reply.get("trace")
            out["first_recorded_step"] = self.reply.get("first_recorded_step")
        else:
            out["error"] = self.error
            out["code"] = self.code
        return out


@dataclass
class JobCapture:
    job: Job
    start_step: int
    directory: Path
    ranks: list[RankCapture]

    @property
    def captured(self) -> list[RankCapture]:
        return [r for r in self.ranks if r.reply is not None]

    @property
    def failed(self) -> list[RankCapture]:
        return [r for r in self.ranks if r.reply is None]

    def aligned(self) -> bool:
        """Every captured rank recorded from the same step."""
        firsts = {r.reply.get("first_recorded_step") for r in self.captured}
        return len(firsts) == 1 and None not in firsts


def _safe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text)[:60] or "job"


def capture_job(
    job: Job,
    steps: int = 3,
    timeout: float = 60.0,
    *,
    warmup: int | None = None,
    out: str | None = None,
    with_stack: bool = False,
    on_progress: Callable[[str], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> JobCapture:
    """Record the same ``steps`` optimizer steps on every rank of ``job`` (see the module
    docstring). Never raises for one rank's failure: it is reported in its RankCapture."""
    root = Path(out or os.environ.get("GPUTOP_CAPTURE_DIR") or default_capture_dir())
    directory = root / f"job-{_safe(job.job_id)}-{int(time.time() * 1000)}"
    directory.mkdir(mode=0o700, parents=True, exist_ok=False)
    lead_s = LEAD_S
    for attempt in range(2):
        start, results = _armed_capture(job, steps, timeout, lead_s, directory, warmup,
                                        with_stack, on_progress, should_stop)
        late = [rc for rc in results if rc.code == "late"]
        if not late or attempt or (should_stop is not None and should_stop()):
            break
        # Misaligned: the ranks that recorded did so at a step the late one missed.
        for rc in results:
            trace = (rc.reply or {}).get("trace")
            if isinstance(trace, str) and Path(trace).parent == directory:
                Path(trace).unlink(missing_ok=True)
        if on_progress is not None:
            on_progress(f"rank {late[0].agent.rank} was already past step {start}; asking again "
                        "further ahead")
        lead_s *= LEAD_RETRY
    return JobCapture(job, start, directory, results)


def _armed_capture(job: Job, steps: int, timeout: float, lead_s: float, directory: Path,
                   warmup: int | None, with_stack: bool,
                   on_progress: Callable[[str], None] | None,
                   should_stop: Callable[[], bool] | None) -> tuple[int, list[RankCapture]]:
    """Read every rank's step, arm them all to start at one step ``lead_s`` ahead, wait."""
    asked = time.monotonic()
    fresh = {a.pid: a for a in agents_on_node()}
    ranks = [fresh.get(a.pid, a) for a in job.ranks]
    top = max(a.steps for a in ranks)
    rate = max((a.steps_per_s or 0.0) for a in ranks)
    # Steps taken since the counts were read, plus the lead.
    lead = max(MIN_LEAD_STEPS, math.ceil(rate * (time.monotonic() - asked + lead_s)))
    start = top + lead
    # The wait for the start step counts against no one's timeout.
    wait_s = lead / rate if rate else 0.0
    results = [RankCapture(a) for a in ranks]
    if on_progress is not None:
        first = start + (1 if warmup is None else warmup) + 1
        on_progress(f"asking {len(ranks)} ranks to record steps {first}-{first + steps - 1} "
                    f"(now at step {top})")

    def one(rc: RankCapture) -> None:
        try:
            rc.reply = request_capture(
                rc.agent.pid, steps, timeout + wait_s, out=str(directory), with_stack=with_stack,
                start_step=start, warmup=warmup, should_stop=should_stop)
        except AgentError as exc:
            rc.error, rc.code = str(exc), exc.code
        except Exception as exc:  # one rank's surprise never loses the others' traces
            rc.error, rc.code = f"{type(exc).__name__}: {exc}"[:300], "error"

    threads = [threading.Thread(target=one, args=(rc,), daemon=True) for rc in results]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return start, results
