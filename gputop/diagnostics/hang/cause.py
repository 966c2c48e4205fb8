"""The cause finding across groups: the culprits (``culprits.find_cause``) as one finding that
names only them, with the collective each failed to join or complete, how long the others have
waited by the dumps' own clock, and the groups that wait because of them as its symptoms.
Pure: no torch, no textual."""

from __future__ import annotations

from collections.abc import Callable

from gputop.diagnostics.hang.culprits import MAX_SYMPTOMS, Cause, Culprit
from gputop.diagnostics.hang.views import HangFinding, _op, _pg_name, _ranks_h

_HOW = {"never-entered": "never reached {}", "stale-dump": "stopped before {}",
        "empty-dump": "left an empty dump, before {}", "no-dump": "left no dump, before {}",
        "never-completed": "never completed {}",
        "never-started": "enqueued {}, but its GPU never started it"}


def _said(c: Culprit) -> str:
    what = f"{_op(c.front.op)} #{c.front.seq} of {_pg_name(c.front.group.id, c.front.group.desc)}"
    return f"rank {c.rank} " + _HOW.get(c.how, c.how + " {}").format(what)


def cause_finding(cause: Cause, now: float, line_of: Callable[[int], str]) -> HangFinding:
    first = cause.culprits[0]
    f = first.front
    began = [x.front.began_ns for x in cause.culprits if x.front.began_ns]
    waited = max(0.0, now - min(began) / 1e9) if began else None
    wait_s = f"{waited:.0f} s" if waited is not None else "an unknown time"
    named = tuple(c.rank for c in cause.culprits)
    groups = len(cause.explained)
    said = "; ".join(_said(c) for c in cause.culprits[:4])
    title = (f"{said}; {len(cause.waiting)} other rank{'s' if len(cause.waiting) != 1 else ''} "
             f"in {groups} group{'s' if groups != 1 else ''} wait because of "
             f"{'it' if len(named) == 1 else 'them'} ({wait_s})")
    symptoms = tuple({
        "process_group": {"id": s.group.id, "desc": s.group.desc}, "collective": s.op,
        "seq": s.seq, "waiting_ranks": [r for r in s.waiters if r not in named],
        "because_of": sorted(set(s.behind) | set(s.absent)) or sorted(
            r for r in named if r in s.group.members)}
        for s in cause.explained[:MAX_SYMPTOMS])
    summary = "; ".join(
        f"{_pg_name(s['process_group']['id'], s['process_group']['desc'])} "
        f"{_op(s['collective'])} #{s['seq']}: {_ranks_h(s['waiting_ranks'])} wait"
        for s in symptoms[:6] if s["waiting_ranks"])
    lines = tuple((r, line_of(r)) for r in sorted(set(named) | set(cause.waiting[:8])))
    where = dict(lines)
    evidence = ("; ".join(f"rank {c.rank}: {c.detail}; rank {c.rank} is at {where[c.rank]}"
                          for c in cause.culprits[:8])
                + (f". {groups} group(s) wait because of {_ranks_h(named)}: {summary}"
                   + (" ..." if groups > 6 else "") if summary else ""))
    entry = f.group.by_seq.get(f.seq, {})
    sample = next(iter(entry.values()), None)
    stuck = all(c.how in ("never-completed", "never-started") for c in cause.culprits)
    return HangFinding(
        id="stuck-collective" if stuck else "hang", severity="critical", title=title,
        evidence=evidence,
        fix=(f"look at what {_ranks_h(named)} {'does' if len(named) == 1 else 'do'} instead of "
             "the collective: a Python loop or a held GIL, a checkpoint write, a DataLoader, a "
             "stopped or dead process, a GPU that stopped (XID errors, `nvidia-smi`); the "
             "other ranks only wait for it"),
        next_step="gputop hang PID (the live stacks of every rank)",
        cost_s=(waited or 0.0) * max(1, len(cause.waiting)), ranks=named,
        waiting_ranks=cause.waiting, collective=f.op,
        process_group={"id": f.group.id, "desc": f.group.desc}, seq=f.seq, since_s=waited,
        waited_s=waited, state=sample.state if sample else None,
        no_dump=tuple(c.rank for c in cause.culprits if c.how == "no-dump"), rank_lines=lines,
        sizes=sample.input_sizes if sample else (), dtypes=sample.input_dtypes if sample else (),
        culprits=tuple(c.to_json() for c in cause.culprits), symptoms=symptoms, pid=None)
