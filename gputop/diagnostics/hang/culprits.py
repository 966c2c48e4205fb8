"""The ranks whose fault explains a hang across many process groups.

In a job with tensor, context, expert and data parallel groups, one rank's fault shows in
every group it belongs to, and every group's other ranks look stuck. A collective blocks until
every member entered it, so the waits form a chain, followed back here to its ends:

* a group's front is its oldest collective some member entered and did not complete; members
  that never entered it (their last enqueued collective is older) hold the others up;
* such a member that itself waits in another group's collective is a victim: follow it there
  (so is one that failed out of a collective a peer never entered: the peer died);
* one that waits in no collective is behind for a reason of its own (a sleep, a Python loop,
  a held GIL): a culprit. So is a member whose dump is empty, or stopped being refreshed long
  before the others' (a stopped process, a held GIL, a dead rank), and a member without a dump
  when nobody dumped is behind;
* a front every member entered and none completed points at the members whose own work
  stopped: those that never completed it while peers did, whose dump is stale, whose GPU never
  started it (NCCL: "scheduled" where the others are "started"), or whose later work in other
  groups never completed while the other members' did. None of these: no culprit is named.

The healthy ranks are the waiters, listed as such. Pure: no torch, no textual.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import dataclass

from gputop.diagnostics.hang.dumps import FrDump, FrEntry
from gputop.diagnostics.hang.views import GroupView, _op, _pg_name

STALE_S = 5.0  # a dump this much older than the median of the others' stopped being refreshed
CLOCK_TRUST_S = 86400.0  # file times this far past the newest record are a copy's, not a dump's
MAX_SYMPTOMS = 256  # groups listed as waiting because of the culprits


@dataclass(frozen=True)
class Front:
    group: GroupView
    seq: int
    op: str
    waiters: tuple[int, ...]  # entered it, not completed
    behind: tuple[int, ...]  # dumped members that never entered it
    absent: tuple[int, ...]  # members without a dump
    finished: tuple[int, ...]  # members that completed it (or failed out of it)
    began_ns: int | None  # the waiters' earliest entry into it


@dataclass(frozen=True)
class Culprit:
    rank: int
    how: str  # never-entered, no-dump, empty-dump, stale-dump, never-completed, never-started
    front: Front
    detail: str  # one line of evidence

    def to_json(self) -> dict:
        g = self.front.group
        return {"rank": self.rank, "how": self.how, "collective": self.front.op,
                "process_group": {"id": g.id, "desc": g.desc}, "seq": self.front.seq,
                "detail": self.detail}


def dump_clock(dumps: Mapping[int, FrDump]) -> float | None:
    """The newest record of all the dumps (epoch seconds): the dumps' own "now"."""
    newest = 0
    for d in dumps.values():
        for e in d.entries:
            newest = max(newest, e.time_created_ns or 0, e.time_started_ns or 0,
                         e.time_completed_ns or 0)
    return newest / 1e9 if newest else None


def trusted_file_times(dumps: Mapping[int, FrDump], clock: float | None) -> dict[int, float]:
    """The dumps' file times, where they agree with the records' clock (not before the newest
    record, nor a day past it: a copy, not the dump's writing)."""
    if clock is None:
        return {}
    return {r: d.dumped_at for r, d in dumps.items()
            if d.dumped_at and -60.0 <= d.dumped_at - clock <= CLOCK_TRUST_S}


def stale_ranks(dumps: Mapping[int, FrDump], times: Mapping[int, float]) -> dict[int, float]:
    """rank -> seconds its dump is older than the median of the others'."""
    if len(times) < 3:
        return {}
    median = statistics.median(times.values())
    return {r: median - t for r, t in times.items() if median - t > STALE_S}


def front(g: GroupView, pend: Mapping[int, FrEntry], dumps: Mapping[int, FrDump]) -> Front | None:
    """The group's oldest collective entered and not completed; else, the oldest one some
    members finished (a failed collective reads as done in gloo) that a dumped member never
    entered."""
    absent = tuple(r for r in g.members if r not in dumps)
    if pend:
        seq = min(e.seq for e in pend.values())
        waiters = tuple(sorted(r for r, e in pend.items() if e.seq == seq))
    else:
        lowest = min(g.last_enqueued.values(), default=-1)
        later = [s for s in g.by_seq if s > lowest]
        if not later or lowest < 0 and not any(s >= 0 for s in g.by_seq):
            return None
        seq, waiters = min(later), ()
    behind = tuple(r for r in g.dumped if g.last_enqueued.get(r, -1) < seq)
    if not pend and not behind:
        return None
    entries = g.by_seq.get(seq, {})
    e = next(iter(entries.values()), None) or next(iter(pend.values()), None)
    finished = tuple(r for r in g.dumped if r not in waiters and r not in behind
                     and g.last_completed.get(r, -1) >= seq)
    began = [entries[r].time_created_ns for r in waiters if r in entries
             and entries[r].time_created_ns] or [
        x.time_created_ns for x in entries.values() if x.time_created_ns]
    return Front(group=g, seq=seq, op=e.op if e else "?", waiters=waiters, behind=behind,
                 absent=absent, finished=finished, began_ns=min(began) if began else None)


class _Search:
    def __init__(self, fronts: dict[str, Front], pending: Mapping[str, Mapping[int, FrEntry]],
                 dumps: Mapping[int, FrDump], stale: Mapping[int, float]) -> None:
        self.fronts, self.pending, self.dumps, self.stale = fronts, pending, dumps, stale
        self.found: dict[int, list[Culprit]] = {}
        self.memo: dict[str, frozenset[int]] = {}
        self.visiting: set[str] = set()
        self.waits_in: dict[int, list[str]] = {}
        for gid, pend in pending.items():
            for r in pend:
                self.waits_in.setdefault(r, []).append(gid)
        # A collective that some member never entered can only have ended for the others by
        # failing (gloo retires the work with the error of a peer that died): those that left
        # it wait on that member as much as those still in it.
        for gid, f in fronts.items():
            if f.behind:
                for r in f.finished:
                    self.waits_in.setdefault(r, []).append(gid)

    def name(self, rank: int, how: str, f: Front, detail: str) -> frozenset[int]:
        self.found.setdefault(rank, []).append(Culprit(rank, how, f, detail))
        return frozenset({rank})

    def blame(self, gid: str) -> frozenset[int]:
        if gid in self.memo:
            return self.memo[gid]
        if gid in self.visiting or gid not in self.fronts:
            return frozenset()
        self.visiting.add(gid)
        f = self.fronts[gid]
        out: set[int] = set()
        what = f"{_op(f.op)} #{f.seq} of {_pg_name(f.group.id, f.group.desc)}"
        for b in f.behind:
            d = self.dumps[b]
            if not d.entries:
                out |= self.name(b, "empty-dump", f, f"its dump has no record: it never entered "
                                 f"{what} (a held GIL or a dead process leaves it so)")
                continue
            elsewhere = [h for h in self.waits_in.get(b, []) if h != gid]
            via: set[int] = set()
            for h in elsewhere:
                via |= self.blame(h)
            if via:
                out |= via
            elif b in self.stale:
                out |= self.name(b, "stale-dump", f, f"never entered {what}; its dump stopped "
                                 f"{self.stale[b]:.0f} s before the others' (stopped, holding "
                                 "the GIL, or dead)")
            elif not elsewhere:
                out |= self.name(b, "never-entered", f, f"never entered {what}, and waits in "
                                 "no collective: it is elsewhere (Python, I/O, a sleep)")
        if not f.behind and f.absent and f.waiters:
            for r in f.absent:
                out |= self.name(r, "no-dump", f, f"no dump: it never entered {what} as far "
                                 "as anyone knows (it exited, or did not dump)")
        if not f.behind and not f.absent:
            out |= self.stuck(f, what)
        self.visiting.discard(gid)
        self.memo[gid] = frozenset(out)
        return self.memo[gid]

    def stuck(self, f: Front, what: str) -> set[int]:
        """Every member entered the front: the members whose own work stopped."""
        entries = f.group.by_seq.get(f.seq, {})
        if f.finished and f.waiters:
            return {r for r in f.waiters for r in self.name(
                r, "never-completed", f, f"entered {what} and never completed it, while "
                f"{len(f.finished)} peer(s) did (its GPU or link stopped)")}
        stale = [r for r in f.waiters if r in self.stale]
        if stale:
            return {r for r in stale for r in self.name(
                r, "stale-dump", f, f"inside {what}; its dump stopped {self.stale[r]:.0f} s "
                "before the others' (stopped, holding the GIL, or dead)")}
        states = {r: entries[r].state for r in f.waiters if r in entries}
        scheduled = [r for r, s in states.items() if s == "scheduled"]
        if scheduled and any(s == "started" for s in states.values()):
            return {r for r in scheduled for r in self.name(
                r, "never-started", f, f"enqueued {what}, but its GPU never started it while "
                "the others' did")}
        # Later work: a member whose work after this one completed elsewhere is healthy; one
        # with later work that all never completed has stopped.
        began = f.began_ns or 0
        later_done, later_stuck = set(), set()
        for r in f.waiters:
            for e in self.dumps[r].entries:
                if (e.time_created_ns or 0) > began and e.pg_id != f.group.id:
                    (later_done if e.completed else later_stuck).add(r)
        stopped = sorted(later_stuck - later_done)
        if later_done and stopped:
            return {r for r in stopped for r in self.name(
                r, "never-completed", f, f"entered {what}; none of its later collectives "
                "completed, while the other members' did (its GPU or link stopped)")}
        return set()


@dataclass(frozen=True)
class Cause:
    culprits: tuple[Culprit, ...]  # one per rank: the collective it failed to join, else complete
    explained: tuple[Front, ...]  # the fronts that wait because of them
    waiting: tuple[int, ...]  # ranks that wait in a collective, culprits left out


_HOW_ORDER = {"never-entered": 0, "stale-dump": 1, "empty-dump": 2, "no-dump": 3,
              "never-completed": 4, "never-started": 4}


def find_cause(groups: list[GroupView], pending: Mapping[str, Mapping[int, FrEntry]],
               dumps: Mapping[int, FrDump], skip: set[str],
               stale: Mapping[int, float]) -> Cause | None:
    """The culprits of every group's wait, or None when no chain ends at a rank (or no rank
    waits in any collective: a job read rank by rank while it runs is not hung)."""
    if not any(pending.values()):
        return None
    fronts = {g.id: f for g in groups if g.id not in skip
              and (f := front(g, pending.get(g.id, {}), dumps)) is not None}
    search = _Search(fronts, pending, dumps, stale)
    explained = [f for gid, f in fronts.items() if search.blame(gid)]
    if not search.found:
        return None
    culprits = []
    for _rank, found in sorted(search.found.items()):
        # The collective it failed to join before one it failed to complete; one it alone
        # holds up before one where others are late too; then the longest-waited one.
        culprits.append(min(found, key=lambda c: (_HOW_ORDER.get(c.how, 9),
                                                  len(c.front.behind) > 1,
                                                  c.front.began_ns or 1 << 62)))
    named = {c.rank for c in culprits}
    waiting = sorted({r for pend in pending.values() for r in pend} - named)
    explained.sort(key=lambda f: (f.began_ns or 1 << 62, f.group.id))
    return Cause(culprits=tuple(culprits), explained=tuple(explained), waiting=tuple(waiting))
