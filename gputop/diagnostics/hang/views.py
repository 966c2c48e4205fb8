"""What the hang attribution tells: a finding about a collective across ranks, one process
group across the ranks that recorded it, and the words both use. Pure data."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from gputop.diagnostics.findings import Finding
from gputop.diagnostics.hang.dumps import FrEntry


@dataclass(frozen=True)
class HangFinding(Finding):
    """A ``Finding`` about a collective across ranks, with what the JSON names."""

    ranks: tuple[int, ...] = ()  # the ranks named as the cause
    waiting_ranks: tuple[int, ...] = ()  # the ranks waiting in the collective
    collective: str | None = None  # the op as the dump names it: "nccl:all_reduce"
    process_group: dict | None = None  # {"id", "desc"}
    seq: int | None = None
    since_s: float | None = None  # how long the longest-waiting rank has waited
    state: str | None = None  # the waiting ranks' entry state: scheduled / started
    no_dump: tuple[int, ...] = ()  # named ranks of which no dump was given
    blocked_ranks: tuple[int, ...] = ()  # late here because they wait in another group
    calls: tuple[dict, ...] = ()  # desync: [{"ranks": [...], "call": "gloo:all_gather ..."}]
    rank_lines: tuple[tuple[int, str], ...] = ()  # (rank, "train.py:57 time.sleep")
    sizes: tuple = ()
    dtypes: tuple[str, ...] = ()
    # How long the ranks have waited, measured to the dumps' own clock (their newest record,
    # or their files' time where it agrees with it), never to the moment of reading.
    waited_s: float | None = None
    # The cause across groups: each culprit with the collective it failed to join or complete
    # ({"rank", "how", "collective", "process_group", "seq"}), and the groups that wait
    # because of them ({"process_group", "collective", "seq", "waiting_ranks", "because_of"}).
    culprits: tuple[dict, ...] = ()
    symptoms: tuple[dict, ...] = ()

    def to_json(self) -> dict:
        out = super().to_json()
        out.update({
            "ranks": list(self.ranks),
            "waiting_ranks": list(self.waiting_ranks),
            "collective": self.collective,
            "process_group": self.process_group,
            "seq": self.seq,
            "since_s": None if self.since_s is None else round(self.since_s, 3),
            "state": self.state,
            "no_dump": list(self.no_dump),
            "blocked_ranks": list(self.blocked_ranks),
            "calls": [dict(c) for c in self.calls],
            "where_by_rank": {str(r): line for r, line in self.rank_lines},
            "sizes": [list(s) for s in self.sizes],
            "dtypes": list(self.dtypes),
            "waited_s": None if self.waited_s is None else round(self.waited_s, 3),
            "culprits": [dict(c) for c in self.culprits],
            "symptoms": [dict(c) for c in self.symptoms],
        })
        return out


@dataclass(frozen=True)
class GroupView:
    """One process group across the ranks that recorded it."""

    id: str
    desc: str
    members: tuple[int, ...]  # ranks known to be in it (dumps, pg_config)
    dumped: tuple[int, ...]  # members whose dump is here
    last_enqueued: dict[int, int]  # rank -> last collective seq enqueued (-1: none)
    last_completed: dict[int, int]  # rank -> last collective seq completed (-1: none)
    by_seq: dict[int, dict[int, FrEntry]]  # seq -> rank -> entry

    def to_json(self) -> dict:
        return {"id": self.id, "desc": self.desc, "members": list(self.members),
                "last_enqueued": {str(r): s for r, s in sorted(self.last_enqueued.items())},
                "last_completed": {str(r): s for r, s in sorted(self.last_completed.items())}}


def _call_site(e: FrEntry) -> str | None:
    for f in e.frames:
        if not f.is_library:
            return f"{f.file.rsplit('/', 1)[-1]}:{f.line}" if f.line is not None else f.file
    return None


def _op(op: str) -> str:
    return op.split(":", 1)[-1]


def _pg_name(pg_id: str, desc: str) -> str:
    return desc if desc and desc != "undefined" else f"process group {pg_id}"


def _ranks_h(ranks: Iterable[int]) -> str:
    ranks = sorted(ranks)
    if not ranks:
        return "no rank"
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    if len(ranks) > 8:
        return f"ranks {', '.join(map(str, ranks[:8]))}, ... ({len(ranks)} ranks)"
    return "ranks " + ", ".join(map(str, ranks))
