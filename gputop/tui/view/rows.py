"""The rows of the process table for one snapshot: GPU processes with their DataLoader workers
as an indented tree (or a flat list), sorted and filtered. Pure, so it is tested on its own."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from gputop.core.efficiency import job_figures, joules_text, share_text, short_text
from gputop.core.format import bytes_h, pct, safe_text
from gputop.core.gpu_family import gpu_family
from gputop.core.job_groups import JobView, jobs_in
from gputop.core.model import ProcSample, Snapshot, WorkerSample
from gputop.core.process_info import per_process, tags
from gputop.tui.view.severity import SEVERITY_MARK

# Sort keys cycled with `s`, in order: (name shown in the column header, column key).
# In the columns' order, then the start time (the newest first; no column of its own) and the
# command.
SORTS = (
    ("GPU", "gpu"),
    ("PID", "pid"),
    ("USER", "user"),
    ("GPU MEM", "gpu_mem"),
    ("SM", "sm"),
    ("CPU", "cpu"),
    ("RSS", "rss"),
    ("start time", "time"),
    ("COMMAND", "command"),
)
# Columns of the table: key, header, width (None: takes the rest), right-aligned.
COLUMNS = (
    ("mark", "", 1, False),
    ("gpu", "GPU", 3, True),
    ("pid", "PID", 7, True),
    ("user", "USER", 8, False),
    ("gpu_mem", "GPU MEM", 7, True),
    ("sm", "SM", 4, True),
    ("cpu", "CPU", 5, True),
    ("rss", "RSS", 6, True),
    ("state", "STATE", 8, False),
    ("command", "COMMAND", None, False),
)
# Descending by default: the biggest users first. GPU and PID read better ascending.
DESCENDING = {"gpu_mem", "cpu", "sm", "rss", "time"}


@dataclass(frozen=True)
class Row:
    key: str  # the pid as text: rows are keyed by pid so updates land in place
    pid: int
    parent: int | None  # the training process of a worker row
    cells: dict[str, str]
    visible: bool = True
    job: str | None = None  # a job row (key "job:<id>"): the job id; pid is its launcher's


@dataclass(frozen=True)
class Group:
    """A training process with the GPUs it uses."""

    proc: ProcSample
    gpus: tuple[int, ...]


def short_command(proc: ProcSample) -> str:
    """The command as drawn: another user's command line may carry terminal escapes. A
    process this namespace cannot see shows why (one line), or its agent's command line."""
    if not proc.visible and not proc.cmdline:
        return safe_text(proc.hidden or proc.name)
    cmd = proc.cmdline or proc.name
    # The program and a script given by path by their names (the process view has the whole
    # line): in a narrow column, `python3 train.py --lr 3e-4` says more than the directories.
    words = [os.path.basename(w) if i == 0 and "/" in w or w.endswith(".py") and "/" in w
             else w for i, w in enumerate(cmd.split(" "))]
    return safe_text(" ".join(words).strip())


def groups(snapshot: Snapshot) -> list[Group]:
    """Each process once, with every GPU it uses (a process may hold several)."""
    found: dict[int, tuple[ProcSample, list[int]]] = {}
    for gpu in snapshot.gpus:
        for proc in gpu.processes:
            if proc.pid in found:
                found[proc.pid][1].append(gpu.index)
            else:
                found[proc.pid] = (proc, [gpu.index])
    for proc in snapshot.other_processes:
        found.setdefault(proc.pid, (proc, []))
    return [Group(p, tuple(g)) for p, g in found.values()]


def _gpu_text(gpus: tuple[int, ...]) -> str:
    return ",".join(map(str, gpus)) if gpus else "-"


def _agent_text(proc: ProcSample) -> str:
    a = proc.agent
    if a is None:
        return ""
    text = "agent"
    if a.steps_per_s is not None:
        text += f" {a.steps_per_s:.2f} steps/s"
    if a.dataloader_wait_share is not None:
        text += f", DataLoader wait {a.dataloader_wait_share * 100:.0f}%"
    return f"  [{text}]"


def _efficiency_text(proc: ProcSample) -> str:
    """MFU, goodput, J/step before the command: a long command line must not hide them."""
    text = short_text(proc.efficiency)
    return f"[{text}] " if text else ""


def _proc_cells(group: Group, severity: str | None = None) -> dict[str, str]:
    p = group.proc
    total_mem = p.gpu_mem
    # A finding about the process puts its glyph before the command (no colour needed).
    mark = f"{SEVERITY_MARK.get(severity, '•')} " if severity else ""
    where = tags(p)  # MIG device, the other pid, container / pod / Slurm job
    return {
        "gpu": _gpu_text(group.gpus),
        "pid": str(p.pid),
        "user": (p.user or "?")[:8],
        "gpu_mem": per_process(p, total_mem, bytes_h),
        "sm": per_process(p, p.sm_util, pct),
        "cpu": pct(p.cpu_percent),
        "rss": bytes_h(p.rss),
        "state": (p.state or "-")[:8],
        "command": mark + _efficiency_text(p) + short_command(p)
                   + (f"  [{where}]" if where else "") + _agent_text(p),
    }


def _job_cells(job: JobView, members: list[Group]) -> dict[str, str]:
    """A job's row: its ranks' GPUs and totals, and the step rate they share."""
    procs = [g.proc for g in members]
    gpus = tuple(sorted({i for g in members for i in g.gpus}))
    sm = [p.sm_util for p in procs if p.sm_util is not None]
    rates = [r.steps_per_s for r in job.ranks if r.steps_per_s is not None]
    waits = [r.dataloader_wait_share for r in job.ranks if r.dataloader_wait_share is not None]
    # What differs between jobs first: the id is long and goes last, where a narrow column cuts.
    what = [f"job: {len(job.ranks)} ranks"
            + (f" of {job.world_size}" if job.world_size and job.world_size != len(job.ranks)
               else "")]
    if rates:
        what.append(f"{min(rates):.2f} steps/s")
    figures = job_figures((g.proc.efficiency, g.gpus) for g in members)
    if figures["mfu"] is not None:
        what.append(f"MFU {share_text(figures['mfu'])}")
    if figures["goodput"] is not None:
        what.append(f"goodput {share_text(figures['goodput'])}")
    if figures["j_per_step"] is not None:
        what.append(f"{joules_text(figures['j_per_step'])}/step")
    if waits:
        lo, hi = min(waits) * 100, max(waits) * 100
        what.append(f"DataLoader wait {lo:.0f}%" if round(lo) == round(hi)
                    else f"DataLoader wait {lo:.0f}-{hi:.0f}%")
    if job.missing_local_ranks:
        what.append(f"{len(job.missing_local_ranks)} not reachable")
    what.append(job.job_id[:48])
    return {
        "gpu": _gpu_text(gpus),
        "pid": str(job.launcher_pid) if job.launcher_pid else "",
        "user": (procs[0].user or "?")[:8] if procs else "",
        "gpu_mem": bytes_h(sum(p.gpu_mem or 0 for p in procs)) if any(p.gpu_mem for p in procs)
        else "n/a",
        "sm": pct(sum(sm) / len(sm)) if sm else "n/a",
        "cpu": pct(sum(g.proc.tree_cpu_percent for g in members)),
        "rss": bytes_h(sum(p.rss or 0 for p in procs)),
        "state": "job",
        "command": "▾ " + " · ".join(what),
    }


def _rank_cells(group: Group, rank: int, last: bool, severity: str | None) -> dict[str, str]:
    cells = _proc_cells(group, severity)
    cells["command"] = f"{'└─' if last else '├─'} rank {rank}  {cells['command']}"
    return cells


def _worker_cells(w: WorkerSample, gpus: tuple[int, ...], last: bool, tree: bool,
                  parent: int, indent: str = "") -> dict[str, str]:
    branch = indent + ("└─ " if last else "├─ ") if tree else ""
    return {
        "gpu": "" if tree else _gpu_text(gpus),
        "pid": str(w.pid),
        "user": "",
        "gpu_mem": "",
        "sm": "",
        "cpu": pct(w.cpu_percent),
        "rss": bytes_h(w.rss),
        "state": w.state[:8],
        "command": (f"{branch}{safe_text(w.name)} (worker)" if tree
                    else f"{safe_text(w.name)} (worker of {parent})"),
    }


def _sort_value(key: str, descending: bool, gpus: tuple[int, ...], pid: int, gpu_mem, sm, cpu,
                rss, user=None, started=None, command=None):
    value = {
        "gpu": gpus[0] if gpus else 1 << 30,
        "gpu_mem": gpu_mem,
        "cpu": cpu,
        "sm": sm,
        "rss": rss,
        "pid": pid,
        "user": user,
        "time": started,
        "command": command,
    }[key]
    # Missing values sort last whatever the direction. Ties keep pid order because the rows
    # are sorted by pid first and Python's sort is stable (reverse=True too).
    present = value is not None
    return (present if descending else not present, value if present else 0)


def _matches(group: Group, needle: str) -> bool:
    p = group.proc
    hay = [str(p.pid), p.name, p.cmdline, p.user or "", _gpu_text(group.gpus), tags(p)]
    hay += [f"{w.pid} {w.name}" for w in p.workers]
    return any(needle in h.lower() for h in hay)


def build_rows(snapshot: Snapshot, sort: str = "gpu", reverse: bool = False, tree: bool = True,
               needle: str = "", marks: Mapping[int, str] | None = None,
               everyone: bool = False) -> list[Row]:
    """The table's rows in display order. ``reverse`` flips the column's natural direction;
    ``marks`` maps a pid to the severity of the worst finding about it. On a host with GPUs a
    process on no GPU is a row only when it belongs to a GPU job (``gpu_family``), unless
    ``everyone`` (key a): other people's CPU trainers are not this node's GPU work."""
    marks = marks or {}
    descending = (sort in DESCENDING) != reverse
    needle = needle.strip().lower()
    every = sorted(groups(snapshot), key=lambda g: g.proc.pid)
    if snapshot.gpus and not everyone and snapshot.other_processes:
        family = gpu_family(snapshot)
        every = [g for g in every if g.gpus or g.proc.pid in family]
    chosen = [g for g in every if not needle or _matches(g, needle)]

    def proc_key(g: Group):
        p = g.proc
        return _sort_value(sort, descending, g.gpus, p.pid, p.gpu_mem, p.sm_util, p.cpu_percent,
                           p.rss, p.user, p.create_time, (p.cmdline or p.name).lower())

    def worker_key(item: tuple[WorkerSample, Group]):
        w, g = item
        return _sort_value(sort, descending, g.gpus, w.pid, None, None, w.cpu_percent, w.rss,
                           None, None, w.name.lower())

    # A child that holds a GPU itself is listed as a process, not again as a worker.
    own_rows = {g.proc.pid for g in every}
    rows: list[Row] = []
    if tree:
        # The ranks of a job (two or more on this node) go under one job row, in rank order;
        # the launcher's own row is the job row.
        by_pid = {g.proc.pid: g for g in chosen}
        jobs = {}
        for job in jobs_in(snapshot):
            members = [by_pid[r.pid] for r in job.ranks if r.pid in by_pid]
            if len(job.ranks) >= 2 and members:
                jobs[job.job_id] = (job, members)
        in_job = {g.proc.pid for _, members in jobs.values() for g in members}
        launchers = {job.launcher_pid: job.job_id for job, _ in jobs.values() if job.launcher_pid}
        units = [g for g in chosen if g.proc.pid not in in_job and g.proc.pid not in launchers]
        heads = {job_id: members[0] for job_id, (_, members) in jobs.items()}
        order = sorted([*units, *heads.values()], key=proc_key, reverse=descending)
        job_of_head = {id(g): job_id for job_id, g in heads.items()}

        def add_workers(g: Group, indent: str) -> None:
            p = g.proc
            mine = sorted((w for w in p.workers if w.pid not in own_rows), key=lambda w: w.pid)
            workers = sorted(((w, g) for w in mine), key=worker_key, reverse=descending)
            for i, (w, _) in enumerate(workers):
                cells = _worker_cells(w, g.gpus, i == len(workers) - 1, True, p.pid, indent)
                rows.append(Row(str(w.pid), w.pid, p.pid, cells))

        for g in order:
            job_id = job_of_head.get(id(g))
            if job_id is None:
                p = g.proc
                rows.append(Row(str(p.pid), p.pid, None, _proc_cells(g, marks.get(p.pid)),
                                p.visible))
                add_workers(g, "")
                continue
            job, members = jobs[job_id]
            rank_of = {r.pid: r.rank for r in job.ranks}
            pid = job.launcher_pid or members[0].proc.pid
            rows.append(Row(f"job:{job_id}", pid, None, _job_cells(job, members), True, job_id))
            for i, m in enumerate(members):
                last = i == len(members) - 1
                rows.append(Row(str(m.proc.pid), m.proc.pid, None,
                                _rank_cells(m, rank_of[m.proc.pid], last,
                                            marks.get(m.proc.pid)), m.proc.visible))
                add_workers(m, "   " if last else "│  ")
        return rows
    items: list[tuple[tuple, Row]] = []
    for g in chosen:
        p = g.proc
        items.append((proc_key(g), Row(str(p.pid), p.pid, None, _proc_cells(g, marks.get(p.pid)),
                                       p.visible)))
        for w in p.workers:
            if w.pid in own_rows:
                continue
            cells = _worker_cells(w, g.gpus, False, False, p.pid)
            items.append((worker_key((w, g)), Row(str(w.pid), w.pid, p.pid, cells)))
    items.sort(key=lambda item: item[1].pid)
    items.sort(key=lambda item: item[0], reverse=descending)
    return [row for _, row in items]
