"""Who hangs a job: the ranks' Flight Recorder records joined per process group and sequence.

For each process group, every member rank's records are lined up by collective sequence
number. The collective the job is stuck in is the oldest one that some rank entered and did
not complete; the ranks that never reached it (their last enqueued collective is older, or no
dump came from them) are the cause, the others wait in it. Also named:

* a desync: at one sequence number ranks called different collectives, or the same one with
  different sizes or dtypes (both calls shown, the minority named);
* a stuck collective: every rank entered it and it never completed, or a rank's work on it was
  enqueued but never started or completed while the others finished it (a GPU that stopped, a
  kernel that never ends).

Each named rank gets a line of where it is: its live stack (``RankStack``, from py-spy) when
given, else the call site of its last collective from its own dump.

Pure: no torch, no textual.
"""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from gputop.diagnostics.findings import Finding, order_findings
from gputop.diagnostics.hang.cause import cause_finding
from gputop.diagnostics.hang.culprits import (
    dump_clock,
    find_cause,
    stale_ranks,
    trusted_file_times,
)
from gputop.diagnostics.hang.dumps import FrDump, FrEntry
from gputop.diagnostics.hang.stacks import RankStack
from gputop.diagnostics.hang.views import (
    GroupView,
    HangFinding,
    _call_site,
    _op,
    _pg_name,
    _ranks_h,
)
from gputop.diagnostics.hang.world import agree

# Collectives whose sizes legitimately differ across ranks (uneven splits): compared by op and
# dtype only.
_UNEVEN = ("all_to_all", "alltoall", "_v", "gather", "scatter")
# Verdicts beyond the finding ids.
HEALTHY = "healthy"
NO_RECORDS = "no-records"  # dumps with no collective recorded (Flight Recorder off or empty)
# A collective its waiting ranks entered less than this long before their records were read
# is in flight, not stuck: a healthy job's collectives last milliseconds, a hang lasts minutes
# (NCCL's own watchdog: 10). Live records are read rank by rank, not at one instant.
IN_FLIGHT_S = 1.0


@dataclass(frozen=True)
class HangReport:
    verdict: str
    findings: tuple[Finding, ...]
    ranks: tuple[int, ...]  # ranks whose dump was read
    missing_ranks: tuple[int, ...]  # ranks known to exist (pg_config, gaps) without a dump
    groups: tuple[GroupView, ...] = ()
    notes: tuple[str, ...] = ()
    healthy_reason: str | None = None
    measured_at: float | None = None  # epoch seconds "since" is measured to
    files: dict[int, str] = field(default_factory=dict)
    missing_count: int = 0  # ranks without a dump (missing_ranks lists the first few)
    world_size: int | None = None  # as the dumps (and the environment) agree

    @property
    def primary(self) -> Finding | None:
        return self.findings[0] if self.findings else None

    def to_json(self) -> dict:
        return {
            "kind": "flight-recorder",
            "verdict": self.verdict,
            "findings": [f.to_json() for f in self.findings],
            "ranks": list(self.ranks),
            "missing_ranks": list(self.missing_ranks),
            "missing_count": self.missing_count,
            "world_size": self.world_size,
            "process_groups": [g.to_json() for g in self.groups],
            "notes": list(self.notes),
            "healthy_reason": self.healthy_reason,
            "measured_at": self.measured_at,
            "files": {str(r): p for r, p in sorted(self.files.items())},
        }


# -- joining ----------------------------------------------------------------------------------

def _groups(dumps: Mapping[int, FrDump], missing: set[int],
            size: int | None = None) -> list[GroupView]:
    desc: dict[str, str] = {}
    members: dict[str, set[int]] = defaultdict(set)
    enq: dict[str, dict[int, int]] = defaultdict(dict)
    done: dict[str, dict[int, int]] = defaultdict(dict)
    by_seq: dict[str, dict[int, dict[int, FrEntry]]] = defaultdict(lambda: defaultdict(dict))
    for rank, d in dumps.items():
        for e in d.entries:
            if e.is_p2p:
                continue
            members[e.pg_id].add(rank)
            desc.setdefault(e.pg_id, e.pg_desc)
            by_seq[e.pg_id][e.seq][rank] = e  # the latest record of a seq wins
            enq[e.pg_id][rank] = max(enq[e.pg_id].get(rank, -1), e.seq)
            if e.completed:
                done[e.pg_id][rank] = max(done[e.pg_id].get(rank, -1), e.seq)
        # pg_status is keyed by the rank's local pg_id (its groups in creation order), not by
        # the group's name: map it through this dump's own entries.
        local = {str(e.pg_index): e.pg_id for e in d.entries if e.pg_index is not None}
        for key, st in d.pg_status.items():
            pg = local.get(key)
            if pg is None:
                continue  # a group none of whose records is left in the ring buffer
            members[pg].add(rank)
            enq[pg][rank] = max(enq[pg].get(rank, -1), st.get("enqueued", -1))
            done[pg][rank] = max(done[pg].get(rank, -1), st.get("completed", -1))
        for pg, cfg in d.pg_config.items():
            if cfg.get("desc"):
                desc.setdefault(pg, cfg["desc"])
    # Global ranks a dump states for a group (NCCL's pg_config; gloo's is mostly empty).
    for d in dumps.values():
        for pg, cfg in d.pg_config.items():
            if pg in members and cfg.get("ranks"):
                members[pg].update(r for r in cfg["ranks"] if size is None or r < size)
    # Every rank is in the default group: ranks known to exist without a dump belong to it.
    for pg in members:
        if pg == "0" or desc.get(pg) == "default_pg":
            members[pg].update(dumps.keys())
            members[pg].update(missing)
    out = []
    for pg in sorted(members, key=lambda p: (len(p), p)):
        mem = tuple(sorted(members[pg]))
        out.append(GroupView(
            id=pg, desc=desc.get(pg, ""), members=mem,
            dumped=tuple(r for r in mem if r in dumps),
            last_enqueued={r: enq[pg].get(r, -1) for r in mem if r in dumps},
            last_completed={r: done[pg].get(r, -1) for r in mem if r in dumps},
            by_seq={s: dict(v) for s, v in by_seq[pg].items()}))
    return out


def _pending(g: GroupView, rank: int) -> FrEntry | None:
    """The rank's oldest collective of ``g`` entered and not completed."""
    done = g.last_completed.get(rank, -1)
    best = None
    for seq, per_rank in g.by_seq.items():
        e = per_rank.get(rank)
        if e is None or e.completed or seq <= done:
            continue
        if best is None or seq < best.seq:
            best = e
    if best is None and g.last_enqueued.get(rank, -1) > done >= -1 and \
            g.last_enqueued.get(rank, -1) >= 0:
        # pg_status says it enqueued more than it completed, but the record fell out of the
        # ring buffer: a placeholder with what is known.
        return None
    return best


def _signature(e: FrEntry) -> tuple:
    op = e.op.lower()
    if any(k in op for k in _UNEVEN):
        return (e.op, e.input_dtypes)
    return (e.op, e.input_sizes, e.input_dtypes)


def _rank_line(rank: int, g: GroupView, stacks: Mapping[int, RankStack] | None,
               dumps: Mapping[int, FrDump], waiting_in: dict[int, str]) -> str:
    """Where a rank is: its live stack, else where it waits, else its last collective's call
    site from its dump."""
    st = stacks.get(rank) if stacks else None
    if st is not None:
        line = st.where_line()
        if line:
            gil = " (holds the GIL)" if st.holds_gil else ""
            return f"{line}{gil}"
        if st.error:
            return f"no stack: {st.error}"
    if rank in waiting_in:
        return waiting_in[rank]
    d = dumps.get(rank)
    if d is None:
        return "no dump from this rank (it exited, or did not dump)"
    last = max((e for e in d.entries if not e.is_p2p), default=None,
               key=lambda e: (e.time_created_ns or 0, e.record_id or 0))
    if last is None:
        return "no collective recorded"
    site = _call_site(last)
    return (f"last collective {_op(last.op)} #{last.seq} of {_pg_name(last.pg_id, last.pg_desc)}"
            + (f" at {site}" if site else "") + "; no live stack (run `gputop hang PID`)")


def _waiting_line(e: FrEntry, g: GroupView) -> str:
    site = _call_site(e)
    return (f"waits in {_op(e.op)} #{e.seq} of {_pg_name(g.id, g.desc)}"
            + (f" (called at {site})" if site else ""))


def attribute(dumps: Mapping[int, FrDump], stacks: Mapping[int, RankStack] | None = None,
              now: float | None = None, gone: Collection[int] = (),
              world_size: int | None = None) -> HangReport:
    """Join the ranks' dumps (rank -> dump) into a verdict and findings. ``stacks`` (rank ->
    live stack) adds each named rank's line; ``now`` (epoch seconds) is the moment waits are
    measured to: by default the latest dump's file time, else the latest record. ``gone``:
    ranks known to have no process any more (a live collection's): with one gone, the job's
    collectives cannot all complete, so a short wait is not taken for one in flight.
    ``world_size`` (the environment's, live) bounds the rank numbers believed."""
    world = agree(dumps, world_size)
    dumps, missing = world.dumps, set(world.missing)
    groups = _groups(dumps, missing, world.size)
    notes: list[str] = list(world.notes)
    clock = dump_clock(dumps)
    file_times = trusted_file_times(dumps, clock)
    # Offline, a dump far older than the others' stopped being refreshed (a stopped or
    # GIL-holding rank's); live, every rank is read at once, and an early read is just early.
    stale = stale_ranks(dumps, file_times) if now is None else {}
    if now is None:
        if file_times:
            now = max(file_times.values())
        else:
            now = clock if clock is not None else time.time()
            if any(d.dumped_at for d in dumps.values()) and clock is not None:
                notes.append("the files' times do not match their records (a copy?): waits "
                             "are measured to the newest record")
            elif clock is not None:
                notes.append("no dump time known: waits are measured to the latest record")
    if not any(d.entries for d in dumps.values()):
        return HangReport(verdict=NO_RECORDS, findings=(), ranks=tuple(sorted(dumps)),
                          missing_ranks=world.listed_missing(), missing_count=len(missing),
                          world_size=world.size, groups=tuple(groups),
                          notes=tuple(notes + [
                              "no collective recorded: was Flight Recorder on? Set "
                              "TORCH_FR_BUFFER_SIZE=2000 in the job's environment (`gputop run` "
                              "does it)"]),
                          measured_at=now, files={r: d.name for r, d in dumps.items()})
    for r, d in sorted(dumps.items()):
        if d.truncated_entries:
            notes.append(f"rank {r}: {d.truncated_entries} oldest entries past the bound, "
                         "dropped")
    # Where each rank waits (first pending collective of each group), for the rank lines.
    waiting_in: dict[int, str] = {}
    waiting_group: dict[int, set[str]] = defaultdict(set)
    pending: dict[str, dict[int, FrEntry]] = {}
    for g in groups:
        pending[g.id] = {r: e for r in g.dumped if (e := _pending(g, r)) is not None}
        for r, e in pending[g.id].items():
            waiting_in.setdefault(r, _waiting_line(e, g))
            waiting_group[r].add(g.id)
    findings: list[Finding] = []
    flights: list[str] = []
    in_flight: set[str] = set()
    for g in groups:
        desync = _desyncs(g, dumps, stacks, waiting_in, now)
        findings += desync
        if desync:  # a desync explains its group's wait: no second finding for it
            continue
        flight = None if gone else _in_flight(g, pending[g.id], dumps, now, stale)
        if flight:
            flights.append(flight)
            in_flight.add(g.id)
        else:
            findings += _hangs(g, pending[g.id], dumps, stacks, waiting_in, waiting_group, now)
    findings = _rank_root_causes(findings, waiting_group)
    if not any(f.id == "desync" for f in findings):
        cause = find_cause(groups, pending, dumps, in_flight, stale)
        if cause is not None:
            explained = {x.group.id for x in cause.explained}
            findings = [cause_finding(cause, now, lambda r: _rank_line(
                r, None, stacks, dumps, waiting_in))] + [
                f for f in findings
                if (getattr(f, "process_group", None) or {}).get("id") not in explained]
    if findings:
        verdict = findings[0].id
        reason = None
    else:
        verdict = HEALTHY
        last = {g.desc or g.id: max(g.last_completed.values(), default=-1) for g in groups}
        reason = "; ".join(flights) if flights else (
            "no collective in flight on any rank: " + ", ".join(
                f"{k} completed #{v}" for k, v in last.items()))
    notes += flights if findings else []
    return HangReport(verdict=verdict, findings=tuple(findings), ranks=tuple(sorted(dumps)),
                      missing_ranks=world.listed_missing(), missing_count=len(missing),
                          world_size=world.size, groups=tuple(groups),
                      notes=tuple(notes), healthy_reason=reason, measured_at=now,
                      files={r: d.name for r, d in dumps.items()})


def _since(entries: list[FrEntry], now: float) -> float | None:
    created = [e.time_created_ns for e in entries if e.time_created_ns]
    return max(0.0, now - min(created) / 1e9) if created else None


def _in_flight(g: GroupView, pend: dict[int, FrEntry], dumps: Mapping[int, FrDump],
               now: float, stale: Collection[int] = ()) -> str | None:
    """Why the group's oldest pending collective is not (yet) a hang, or None when it may be.

    Each rank's records are read at their own moment (``dumped_at``). A rank read before the
    others entered the collective cannot be said to have never reached it; and waits shorter
    than ``IN_FLIGHT_S`` at the waiting ranks' own reading are a collective in progress."""
    if not pend:
        return None
    seq = min(e.seq for e in pend.values())
    waiters = {r: e for r, e in pend.items() if e.seq == seq}
    created = [e.time_created_ns / 1e9 for e in waiters.values() if e.time_created_ns]
    if not created:
        return None  # no times recorded: nothing to tell in flight from stuck
    began = min(created)
    behind = [r for r in g.dumped if g.last_enqueued.get(r, -1) < seq]
    early = [r for r in behind if (dumps[r].dumped_at or now) < began and r not in stale]
    waits = [(dumps[r].dumped_at or now) - e.time_created_ns / 1e9
             for r, e in waiters.items() if e.time_created_ns]
    what = f"{_op(next(iter(waiters.values())).op)} #{seq} of {_pg_name(g.id, g.desc)}"
    if early and len(early) == len(behind):
        return (f"{what} was in flight: {_ranks_h(early)} "
                f"{'was' if len(early) == 1 else 'were'} read before the others entered it; "
                "run it again to tell a hang")
    if max(waits) < IN_FLIGHT_S:
        return (f"{what} was in flight ({max(waits):.2f} s when read, under {IN_FLIGHT_S:.0f} "
                "s): not a hang")
    return None


def _hangs(g: GroupView, pend: dict[int, FrEntry], dumps: Mapping[int, FrDump],
           stacks: Mapping[int, RankStack] | None, waiting_in: dict[int, str],
           waiting_group: Mapping[int, set[str]], now: float) -> list[Finding]:
    if not pend:
        return []
    seq = min(e.seq for e in pend.values())
    waiting = sorted(r for r, e in pend.items() if e.seq == seq)
    entry = pend[waiting[0]]
    behind = sorted(r for r in g.dumped if g.last_enqueued.get(r, -1) < seq)
    absent = sorted(r for r in g.members if r not in dumps)
    waiters = [pend[r] for r in waiting]
    since = _since(waiters, now)
    pg = {"id": g.id, "desc": g.desc}
    # Ranks that entered it and are out of it while others still wait: a failed collective
    # (a peer died: gloo retires the work with its error) reads as done.
    left = sorted(r for r in g.dumped if r not in pend and g.last_completed.get(r, -1) >= seq
                  and seq in g.by_seq and r in g.by_seq[seq])
    # A late rank that itself waits in another group's collective is blocked there, a victim:
    # the cause is named in that group's finding. Name the others (all, if every one waits).
    blocked = [r for r in behind if waiting_group.get(r, set()) - {g.id}]
    late = [r for r in behind if r not in blocked] or behind
    # Ranks without a dump are named only when no dumped rank is late: dumps of one node of a
    # larger job lack the other nodes' ranks, which may well be waiting too.
    culprits = sorted(late) if late else absent
    lines = tuple((r, _rank_line(r, g, stacks, dumps, waiting_in))
                  for r in sorted(set(culprits) | set(waiting)))
    states = Counter(e.state for e in waiters)
    common: dict[str, Any] = dict(collective=entry.op, process_group=pg, seq=seq, since_s=since,
                  state=states.most_common(1)[0][0], rank_lines=lines,
                  sizes=entry.input_sizes, dtypes=entry.input_dtypes, pid=None)
    wait_s = f"{since:.0f} s" if since is not None else "an unknown time"
    if culprits:
        names = _ranks_h(culprits)
        never = " never reached"
        where = "; ".join(f"rank {r} is at {dict(lines)[r]}" for r in culprits[:4])
        title = (f"{names}{never} {_op(entry.op)} #{seq} of {_pg_name(g.id, g.desc)}; the "
                 f"{len(waiting)} other rank{'s' if len(waiting) != 1 else ''} "
                 f"{'have' if len(waiting) != 1 else 'has'} waited there for {wait_s}")
        evidence = (f"{_ranks_h(waiting)} entered {entry.call()} #{seq} and "
                    f"{'wait' if len(waiting) != 1 else 'waits'} ({common['state']}); "
                    + "; ".join(f"rank {r} last enqueued #{g.last_enqueued.get(r, -1)}"
                                for r in behind[:8])
                    + ("; " if behind and absent else "")
                    + (f"no dump from {_ranks_h(absent)}" if absent else "")
                    + (f"; {_ranks_h(left)} left it (completed, or failed when a peer died)"
                       if left else "")
                    + f". {where}"
                    + ("".join(f"; rank {r} is blocked: it {waiting_in[r]}" for r in blocked
                               if r not in culprits)))
        return [HangFinding(
            id="hang", severity="critical", title=title, evidence=evidence,
            fix=(f"look at what {names} {'does' if len(culprits) == 1 else 'do'} instead of "
                 f"calling {_op(entry.op)}: a Python loop, a checkpoint write, a DataLoader, "
                 "a dead GPU; every rank must call the same collectives in the same order"),
            next_step="gputop hang PID (the live stacks of every rank)",
            cost_s=(since or 0.0) * len(waiting), ranks=tuple(culprits),
            waiting_ranks=tuple(waiting), no_dump=tuple(absent),
            blocked_ranks=tuple(r for r in blocked if r not in culprits), **common)]
    # Every member entered it: either some rank's work never started/completed, or all hang.
    scheduled = sorted(r for r in waiting if pend[r].state == "scheduled")
    started = sorted(r for r in waiting if pend[r].state == "started")
    finished = sorted(r for r in g.dumped if r not in pend and
                      g.last_completed.get(r, -1) >= seq)
    if started and scheduled:
        named, how = scheduled, "enqueued it, but its GPU never started it"
    elif finished:
        named, how = waiting, "enqueued it and never completed it, while the others did"
    else:
        named, how = [], "every rank entered it and none completed it"
    title = (f"{_op(entry.op)} #{seq} of {_pg_name(g.id, g.desc)} never completed: "
             + (f"{_ranks_h(named)} {how}" if named else how)
             + f" ({wait_s})")
    return [HangFinding(
        id="stuck-collective", severity="critical", title=title,
        evidence=(f"{entry.call()} #{seq}: " + ", ".join(
            f"rank {r} {pend[r].state}" for r in waiting[:16])
            + (f"; completed by {_ranks_h(finished)}" if finished else "")),
        fix=("a GPU that stopped or a kernel that never ends: check the named ranks' GPUs "
             "(XID errors, `nvidia-smi`), the network between the ranks (NCCL_DEBUG=INFO), "
             "and what ran on their streams before the collective"),
        next_step="gputop hang PID (the live stacks of every rank)",
        cost_s=(since or 0.0) * len(waiting), ranks=tuple(named),
        waiting_ranks=tuple(r for r in waiting if r not in named), **common)]


def _desyncs(g: GroupView, dumps: Mapping[int, FrDump], stacks: Mapping[int, RankStack] | None,
             waiting_in: dict[int, str], now: float) -> list[Finding]:
    """The first sequence number at which the ranks' calls differ."""
    for seq in sorted(g.by_seq):
        per_rank = g.by_seq[seq]
        if len(per_rank) < 2:
            continue
        groups: dict[tuple, list[int]] = defaultdict(list)
        for r, e in sorted(per_rank.items()):
            groups[_signature(e)].append(r)
        if len(groups) < 2:
            continue
        # The majority call is taken as intended; at a tie, the group with the lowest rank.
        ordered = sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[1][0]))
        majority_ranks = ordered[0][1]
        named = sorted(r for _, rs in ordered[1:] for r in rs)
        calls: tuple[dict[str, Any], ...] = tuple(
            {"ranks": rs, "call": per_rank[rs[0]].call()} for _, rs in ordered)
        first_named = per_rank[named[0]]
        intended = per_rank[majority_ranks[0]]
        pending = [e for e in per_rank.values() if not e.completed]
        since = _since(pending, now) if pending else None
        lines = tuple((r, _rank_line(r, g, stacks, dumps, waiting_in))
                      for r in sorted(per_rank))
        title = (f"desync at #{seq} of {_pg_name(g.id, g.desc)}: {_ranks_h(named)} called "
                 f"{first_named.call()} where {_ranks_h(majority_ranks)} called "
                 f"{intended.call()}")
        return [HangFinding(
            id="desync", severity="critical", title=title,
            evidence="; ".join(f"{_ranks_h(c['ranks'])}: {c['call']}" for c in calls),
            fix=("every rank must call the same collectives, with the same sizes and dtypes, "
                 "in the same order: look for a branch on the rank (if rank == 0: ...) around "
                 f"the call at {_call_site(first_named) or 'the named ranks call site'}"),
            next_step="gputop analyze --json DIR (every call at that sequence number)",
            cost_s=(since or 0.0) * len(per_rank) + 1e-3, ranks=tuple(named),
            waiting_ranks=tuple(sorted(majority_ranks)), collective=intended.op,
            process_group={"id": g.id, "desc": g.desc}, seq=seq, since_s=since,
            state=intended.state, calls=calls, rank_lines=lines,
            sizes=intended.input_sizes, dtypes=intended.input_dtypes)]
    return []


def _rank_root_causes(findings: list[Finding],
                      waiting_group: Mapping[int, set[str]]) -> list[Finding]:
    """Root causes first: a finding whose named ranks wait in no other group's collective (they
    are elsewhere: Python, I/O) before one whose named ranks are stuck in another group (victims
    of that other hang); then findings that name ranks; desync before hang; then the longest
    wait, then cost."""
    kind = {"desync": 0, "hang": 1, "stuck-collective": 2}

    def key(f: Finding) -> tuple:
        named = getattr(f, "ranks", ())
        pg = (getattr(f, "process_group", None) or {}).get("id")
        victims = sum(1 for r in named if waiting_group.get(r, set()) - {pg})
        # At equal standing, the longest wait first: the collective the named ranks failed to
        # reach earliest is where they stopped (a later one in another group follows from it).
        # A finding with blocked ranks (late here because they wait in another group) follows
        # from that other group's finding.
        since = getattr(f, "since_s", None) or 0.0
        return (victims / len(named) if named else 1.0, not named, kind.get(f.id, 3),
                bool(getattr(f, "blocked_ranks", ())), -since)

    ordered = order_findings(findings)
    return sorted(ordered, key=key)


