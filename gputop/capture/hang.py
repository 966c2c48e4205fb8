"""One key, every rank: collect a job's Flight Recorder buffers and Python stacks at once.

``gputop hang PID|JOB_ID`` and ``h`` in the monitor call ``collect()``. The job's local ranks
are found from their environments (``/proc/PID/environ``: RANK, LOCAL_RANK, torchrun's run id,
SLURM's job), not from their agents: a rank that holds the GIL cannot answer its agent, and it
is the rank we most need. Then, for every rank at the same moment, on threads of their own:
its agent's ``fr_dump`` (this rank's Flight Recorder ring, bounded by the agent) and a
``py-spy dump`` of its threads (py-spy reads the process's memory; it needs no GIL and no
agent). Each has its own deadline; a rank whose agent or py-spy fails is named with why.

Blocking: run it on a worker thread, never on an event loop (the TUI does).
"""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gputop.client.agents import AgentError, list_agents, request
from gputop.stacks.access import StacksError, refusal
from gputop.stacks.profile import Frame, ThreadNow, parse_dump
from gputop.stacks.pyspy import NOT_INSTALLED, _dump, find_py_spy

FR_TIMEOUT_S = 5.0  # the agent's reply to fr_dump (it bounds the dump itself to 3 s)
STACK_TIMEOUT_S = 10.0  # every py-spy dump of a rank together (gputop.stacks.pyspy)
STACK_TRIES = 3
MAX_RANKS = 1024  # local ranks collected at once (threads: two per rank)
_ENV_LIMIT = 1 << 20  # bytes of /proc/PID/environ read


@dataclass
class RankCollected:
    """What one rank gave: its Flight Recorder reply and its threads' stacks (or why not)."""

    pid: int
    rank: int | None
    local_rank: int | None
    world_size: int | None
    fr: dict[str, Any] | None = None  # the agent's fr_dump reply (ok)
    fr_error: str | None = None
    threads: list[ThreadNow] = field(default_factory=list)
    stack_error: str | None = None
    status: dict[str, Any] | None = None  # the agent's status, when it answered in time

    def main_thread(self) -> ThreadNow | None:
        for t in self.threads:
            if t.name == "MainThread":
                return t
        return self.threads[0] if self.threads else None

    def user_frame(self) -> Frame | None:
        """The innermost frame of the main thread outside installed libraries."""
        thread = self.main_thread()
        if thread is None:
            return None
        for frame in thread.frames:  # innermost first
            if not frame.is_library:
                return frame
        return thread.frames[0] if thread.frames else None


@dataclass
class HangCollection:
    job_id: str
    launcher_pid: int | None
    ranks: list[RankCollected]
    time: float  # unix time the collection began
    took_s: float = 0.0
    notes: list[str] = field(default_factory=list)
    # Local ranks the launcher started that have no process any more: (rank, pid or None).
    exited: list[tuple[int, int | None]] = field(default_factory=list)


class HangError(Exception):
    """No job to collect from; ``str()`` is one line."""


# --- finding the job's ranks -----------------------------------------------------------------


def _environ(pid: int) -> dict[str, str] | None:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            raw = f.read(_ENV_LIMIT)
    except OSError:
        return None
    out = {}
    for item in raw.split(b"\0"):
        key, eq, value = item.partition(b"=")
        if eq:
            out[key.decode(errors="replace")] = value.decode(errors="replace")
    return out


def _int(env: dict[str, str], *names: str) -> int | None:
    for name in names:
        value = env.get(name, "").strip()
        if value.isdigit():
            return int(value)
    return None


def _ppid(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return int(f.read().rsplit(b")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def job_of(env: dict[str, str], ppid: int | None) -> str | None:
    """The job id the agent reports (``gputop.agent.info.job_id``), from an environment."""
    run = env.get("TORCHELASTIC_RUN_ID")
    if run:
        endpoint = f"{env.get('MASTER_ADDR', '')}:{env.get('MASTER_PORT', '')}"
        return f"torchrun:{run}@{endpoint}" if run == "none" else f"torchrun:{run}"
    slurm = env.get("SLURM_JOB_ID")
    if slurm:
        step = env.get("SLURM_STEP_ID")
        return f"slurm:{slurm}" + (f".{step}" if step else "")
    return f"launcher:{ppid}" if ppid else None


def _children(pid: int) -> list[int]:
    try:
        import psutil

        return [c.pid for c in psutil.Process(pid).children()]
    except Exception:
        return []


@dataclass(frozen=True)
class _Candidate:
    pid: int
    local_world_size: int | None
    ppid: int | None
    job: str | None
    rank: int | None
    local_rank: int | None
    world_size: int | None


def _candidate(pid: int) -> _Candidate | None:
    env = _environ(pid)
    if env is None:
        return None
    ppid = _ppid(pid)
    rank = _int(env, "RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK")
    return _Candidate(pid, _int(env, "LOCAL_WORLD_SIZE", "SLURM_NTASKS_PER_NODE",
                                "OMPI_COMM_WORLD_LOCAL_SIZE"), ppid, job_of(env, ppid) if rank is not None else None, rank,
                      _int(env, "LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK"),
                      _int(env, "WORLD_SIZE", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE"))


def find_ranks(target: str) -> tuple[str, int | None, list[_Candidate]]:
    """(job id, launcher pid, the job's local ranks) for a pid (a rank or its launcher) or a
    job id; HangError with one line when there is none."""
    agents = set(list_agents())
    pids = set(agents)
    if target.isdigit():
        pids |= {int(target), *_children(int(target))}
    found = {p: c for p in pids if (c := _candidate(p)) is not None}
    # Ranks whose agent does not answer are still the launcher's children.
    for ppid in {c.ppid for c in found.values() if c.rank is not None and c.ppid}:
        for child in _children(ppid):
            if child not in found and (c := _candidate(child)) is not None:
                found[child] = c
    job_id: str | None = None
    if target.isdigit():
        pid = int(target)
        me = found.get(pid)
        if me is not None and me.job is not None:
            job_id = me.job
        else:
            kids = [c for c in found.values() if c.ppid == pid and c.job]
            job_id = kids[0].job if kids else None
        if job_id is None:
            raise HangError(f"pid {pid} is neither a rank of a distributed job nor its launcher "
                            "(no RANK in its environment, or it is not ours to read)")
    else:
        job_id = target
    ranks = sorted((c for c in found.values() if c.job == job_id and c.rank is not None),
                   key=lambda c: (c.rank or 0, c.pid))
    if not ranks:
        raise HangError(f"no ranks of job {target[:200]!r} on this node")
    parents = {c.ppid for c in ranks}
    return job_id, parents.pop() if len(parents) == 1 else None, ranks[:MAX_RANKS]


# --- collecting --------------------------------------------------------------------------------


def _fr(rank: RankCollected) -> None:
    try:
        rank.fr = request(rank.pid, {"cmd": "fr_dump"}, FR_TIMEOUT_S)
    except AgentError as exc:
        rank.fr_error = str(exc) if exc.code != "timeout" else (
            "its agent did not answer (the process may hold the GIL)")
    except (OSError, ValueError) as exc:
        rank.fr_error = f"{type(exc).__name__}: {exc}"[:300]


def _status(rank: RankCollected) -> None:
    try:
        rank.status = request(rank.pid, {"cmd": "status"}, 2.0)
    except (AgentError, OSError, ValueError):
        rank.status = None


def _stack(rank: RankCollected, binary: str | None, workdir: Path) -> None:
    if binary is None:
        rank.stack_error = NOT_INSTALLED
        return
    try:
        why = refusal(rank.pid)
    except StacksError as exc:
        rank.stack_error = str(exc)
        return
    if why is not None:
        rank.stack_error = why
        return
    # --nonblocking reads a running process's memory as it changes: a read can catch it
    # mid-update and fail, the next one not. Tried again while the bound allows.
    deadline = time.monotonic() + STACK_TIMEOUT_S
    for _ in range(STACK_TRIES):
        left = deadline - time.monotonic()
        if left < 0.5:
            break
        text = _dump(binary, rank.pid, workdir, left)
        threads = parse_dump(text, rank.pid) if text else []
        if threads:
            rank.threads = threads
            return
    rank.stack_error = f"py-spy could not read pid {rank.pid}'s stacks"


def collect(target: str, stacks: bool = True) -> HangCollection:
    """Every local rank's Flight Recorder buffer and stacks, asked for at the same moment."""
    job_id, launcher, found = find_ranks(str(target))
    started, t0 = time.time(), time.perf_counter()
    ranks = [RankCollected(c.pid, c.rank, c.local_rank, c.world_size) for c in found]
    binary = find_py_spy() if stacks else None
    workdir = Path(tempfile.mkdtemp(prefix="gputop-hang-"))  # 0700, ours
    try:
        threads = []
        for r in ranks:
            jobs: list[tuple[Any, tuple]] = [(_fr, (r,)), (_status, (r,))]
            if stacks:
                jobs.append((_stack, (r, binary, workdir)))
            for fn, args in jobs:
                threads.append(threading.Thread(target=fn, args=args, daemon=True,
                                                name="gputop-hang"))
        for t in threads:
            t.start()
        deadline = time.monotonic() + STACK_TIMEOUT_S + FR_TIMEOUT_S
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    collection = HangCollection(job_id, launcher, ranks, started,
                                round(time.perf_counter() - t0, 3))
    collection.exited = _exited(found)
    worlds = {r.world_size for r in ranks if r.world_size}
    if worlds and max(worlds) > len(ranks):
        collection.notes.append(f"{len(ranks)} of {max(worlds)} ranks are on this node; the "
                                "others are not collected here")
    if not any(r.fr for r in ranks):
        collection.notes.append("no rank gave a Flight Recorder buffer: start the job with "
                                "`gputop run` (or set TORCH_FR_BUFFER_SIZE=2000) to record "
                                "its collectives; stacks only")
    return collection


def _exited(found: list[_Candidate]) -> list[tuple[int, int | None]]:
    """Local ranks the launcher started that are not among its processes any more."""
    local = max((c.local_world_size or 0 for c in found), default=0)
    known = [c for c in found if c.local_rank is not None and c.rank is not None]
    if not local or not known or local > MAX_RANKS:
        return []
    offset = (known[0].rank or 0) - (known[0].local_rank or 0)  # this node's first rank
    seen = {c.local_rank for c in known}
    return [(offset + lr, None) for lr in range(local) if lr not in seen]
