"""A live collection (``capture.hang``) joined by the attribution (``diagnostics.hang``).

Every rank's Flight Recorder reply becomes a dump (read with the same bounded reader as a dump
file: the agent is untrusted too), every rank's py-spy stack a ``RankStack``; then
``attribute()`` names the rank, the collective, its sequence number and the line. Ranks of the
job that have no process any more (``rank-exited``) and ranks whose agent did not answer (they
hold the GIL: only py-spy read them) are named in the notes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any

from gputop.capture.hang import HangCollection, RankCollected
from gputop.core.format import safe_text
from gputop.core.validate import number
from gputop.diagnostics.hang.attribution import HangFinding, HangReport, attribute
from gputop.diagnostics.hang.dumps import DumpError, FrDump, read_dump_bytes
from gputop.diagnostics.hang.stacks import RankStack, StackFrame


@dataclass
class LiveHang:
    collection: HangCollection
    report: HangReport
    notes: list[str]


def _stack(r: RankCollected) -> RankStack | None:
    if r.rank is None:
        return None
    thread = r.main_thread()
    if thread is None:
        return RankStack(rank=r.rank, pid=r.pid, error=r.stack_error or "no stack read")
    frames = tuple(StackFrame(f.function, f.file, f.line) for f in thread.frames)
    return RankStack(rank=r.rank, pid=r.pid, frames=frames, holds_gil=thread.holds_gil,
                     thread=thread.name)


def _dump(r: RankCollected, notes: list[str]) -> FrDump | None:
    if r.fr is None or r.rank is None:
        return None
    body = r.fr.get("dump")
    if not isinstance(body, dict):
        notes.append(f"rank {r.rank}: its agent's fr_dump reply has no dump")
        return None
    try:
        dump = read_dump_bytes(json.dumps(body).encode(), f"rank{r.rank}")
    except DumpError as exc:
        notes.append(f"rank {r.rank}: {safe_text(str(exc))}")
        return None
    # The moment this rank's records were read (the agent's clock: the same host's): ranks are
    # read one by one, and a rank read before the others entered a collective is not behind.
    at, took = number(r.fr.get("time"), low=0), number(r.fr.get("dump_s"), 0, 60)
    if at and took is not None and took < 60:
        return replace(dump, dumped_at=float(at) - float(took))
    return dump


def join(collection: HangCollection) -> LiveHang:
    """The attribution of one collection, with what the collection itself knows."""
    notes = list(collection.notes)
    dumps: dict[int, FrDump] = {}
    stacks: dict[int, RankStack] = {}
    for r in collection.ranks:
        dump = _dump(r, notes)
        if dump is not None and r.rank is not None:
            dumps[r.rank] = dump
        stack = _stack(r)
        if stack is not None:
            stacks[stack.rank] = stack
        if r.fr is None and r.fr_error:
            notes.append(f"rank {r.rank} (pid {r.pid}): no Flight Recorder buffer: "
                         f"{safe_text(r.fr_error)}")
        if r.stack_error:
            notes.append(f"rank {r.rank} (pid {r.pid}): no stack: {safe_text(r.stack_error)}")
    for rank, _ in collection.exited:
        notes.append(f"rank {rank} has no process any more (rank-exited): the others wait "
                     "for it; its last collectives are in the others' records only")
    # The world size the ranks' environments agree on bounds the rank numbers believed (an
    # environment is another user's: RANK=9999999 is not a job of ten million ranks).
    worlds = {r.world_size for r in collection.ranks if r.world_size}
    report = attribute(dumps, stacks, now=collection.time,
                       gone={rank for rank, _ in collection.exited},
                       world_size=worlds.pop() if len(worlds) == 1 else None)
    return LiveHang(collection, _exited(report, collection), notes)


def _exited(report: HangReport, collection: HangCollection) -> HangReport:
    """A hang whose named ranks have no process any more is ``rank-exited``."""
    gone = {rank for rank, _ in collection.exited}
    if not gone:
        return report
    findings = list(report.findings)
    for i, f in enumerate(findings):
        if not isinstance(f, HangFinding):
            continue
        if f.id == "hang" and f.ranks and set(f.ranks) <= gone:
            names = ", ".join(str(r) for r in f.ranks)
            title = f"rank {names} exited (no process any more); {f.title}"
        elif f.id in ("hang", "stuck-collective") and f.waiting_ranks \
                and not gone & set(f.waiting_ranks):
            # Every rank still here entered it: the one that exited never will.
            names = ", ".join(str(r) for r in sorted(gone))
            pg = (f.process_group or {}).get("desc") or (f.process_group or {}).get("id")
            waited = f" for {f.since_s:.0f} s" if f.since_s is not None else ""
            op = (f.collective or "the collective").split(":")[-1]
            title = (f"rank {names} exited (no process any more) and never reached {op} "
                     f"#{f.seq} of {pg}; the {len(f.waiting_ranks)} other rank(s) have waited "
                     f"there{waited}")
            f = replace(f, ranks=tuple(sorted(gone)))
        else:
            continue
        findings[i] = replace(
            f, id="rank-exited", title=title,
            fix=(f"rank {names} ended while the others wait for it: see why (its log, an "
                 "out-of-memory kill in `dmesg`, a crash), then restart from the last "
                 "checkpoint; torchrun's --max-restarts restarts the ranks on its own"))
        # The cause first: the exited rank explains the others' wait.
        findings.insert(0, findings.pop(i))
        break
    else:
        return report
    verdict = findings[0].id if findings else report.verdict
    return replace(report, findings=tuple(findings), verdict=verdict)


def to_json(live: LiveHang) -> dict[str, Any]:
    out = live.report.to_json()
    out["job_id"] = live.collection.job_id
    out["launcher_pid"] = live.collection.launcher_pid
    out["collected_s"] = live.collection.took_s
    out["live_notes"] = live.notes
    out["exited_ranks"] = [rank for rank, _ in live.collection.exited]
    out["ranks_collected"] = []
    for r in live.collection.ranks:
        stack = _stack(r)
        out["ranks_collected"].append(
            {"rank": r.rank, "pid": r.pid, "flight_recorder": r.fr is not None,
             "fr_error": r.fr_error, "stack": r.main_thread() is not None,
             "where": stack.where_line() if stack is not None else None,
             "stack_error": r.stack_error})
    return out


def to_text(live: LiveHang) -> str:
    from gputop.diagnostics.hang.render import format_report

    c = live.collection
    head = (f"job {safe_text(c.job_id)}: {len(c.ranks)} local rank(s) collected in "
            f"{c.took_s:.2f} s")
    lines = [head, format_report(live.report).rstrip()]
    lines += [f"note: {n}" for n in live.notes]
    return "\n".join(lines)
