"""Several ranks of one job, side by side: who holds the others back, and why.

A collective finishes only when every rank has joined it, so a rank that reaches it late makes
every other rank wait inside it; from one rank's trace that wait looks like communication. With
every rank's trace of the same steps (``gputop capture --job`` records the same iterations on
each rank) the waits are told apart from the data movement:

- collectives are matched across ranks by order (every rank issues a communicator's
  collectives in the same order; per stream when the ranks use the same streams); the rank
  that starts a collective last is the one the others wait for;
- a rank's *wait* in a collective is the time from its own start to the last rank's start
  (capped at its end); the rest of the collective moves data (bandwidth);
- its *straggler score* is how late it starts collectives relative to the spread of start
  times, 0 (always first) to 1 (always last), weighted by how long the others waited;
- the straggler's own top cause (its costliest finding other than communication) says what it
  did instead: its DataLoader, a host sync, slower compute.

Comparing start times needs the ranks' clocks to agree: true for ranks of one node (one system
clock); when their steps do not overlap in time (traces of several nodes), the ranks are
compared by per-step work instead (step time minus time in collectives).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field, replace

from gputop.core.format import ms_h
from gputop.diagnostics.findings import WARNING_SHARE, Finding, severity_for
from gputop.diagnostics.trace.measuring.intervals import intersect, merge, total
from gputop.diagnostics.trace.measuring.metrics import TraceMetrics

# A rank counts as the straggler when it is the last to start most of the collective wait
# (more than half of the weighted lateness; on two ranks, the later one by definition), and
# systematically so: if every rank were equally likely to be last in a step, chance alone would
# make some rank last this often less than one time in four (a sign test over steps, or over
# collectives when the trace holds one step). With 3 steps on 4 ranks that is last in all 3
# (chance 6%), not in 2 of 3 (63%): a rank late now and then is the scheduler's noise, not a
# cause to fix.
STRAGGLER_SCORE = 0.5
CHANCE_MAX = 0.25
# Start-time spreads under this are the collective's own launch jitter, not a late rank.
JITTER_US = 50.0


@dataclass
class RankRow:
    label: str
    rank: int | None
    file: str
    steps: int
    step_ms: float
    compute_ms: float
    exposed_comm_ms: float
    comm_ms: float
    wait_ms: float = 0.0
    exposed_wait_ms: float = 0.0
    straggler_score: float = 0.0
    last_in: int = 0  # collectives it started last
    top_cause: str | None = None
    causes: dict[str, float] = field(default_factory=dict)  # finding id -> ms per step

    @property
    def exposed_bandwidth_ms(self) -> float:
        return max(0.0, self.exposed_comm_ms - self.exposed_wait_ms)

    def to_json(self) -> dict:
        return {
            "label": self.label, "rank": self.rank, "file": self.file, "steps": self.steps,
            "step_ms": _r(self.step_ms), "compute_ms": _r(self.compute_ms),
            "comm_ms": _r(self.comm_ms), "exposed_comm_ms": _r(self.exposed_comm_ms),
            "wait_in_collectives_ms": _r(self.wait_ms),
            "exposed_waiting_for_late_rank_ms": _r(self.exposed_wait_ms),
            "exposed_bandwidth_ms": _r(self.exposed_bandwidth_ms),
            "straggler_score": round(self.straggler_score, 3),
            "collectives_started_last": self.last_in, "top_cause": self.top_cause,
        }


@dataclass
class CrossRank:
    rows: list[RankRow]
    method: str  # "collective start times" | "per-step work" | "none"
    steps: list[str]
    collectives: int = 0
    straggler: RankRow | None = None
    late_ms: float = 0.0  # the straggler's mean lateness per collective, vs the median rank
    steps_last: int = 0  # steps in which it was the last rank overall
    others_wait_ms: float = 0.0  # what the others lose per step waiting for it (median)
    cause: str | None = None  # what the straggler did instead (see straggler_cause)
    findings: list[Finding] = field(default_factory=list)

    def to_json(self) -> dict:
        out = {
            "method": self.method,
            "steps": list(self.steps),
            "collectives_matched": self.collectives,
            "ranks": [r.to_json() for r in self.rows],
            "straggler": None,
            "findings": [f.to_json() for f in self.findings],
        }
        if self.straggler is not None:
            out["straggler"] = {
                "label": self.straggler.label, "rank": self.straggler.rank,
                "score": round(self.straggler.straggler_score, 3),
                "late_ms_per_collective": _r(self.late_ms),
                "steps_last": self.steps_last, "steps": len(self.steps),
                "cause": self.cause,
                "others_wait_ms_per_step": _r(self.others_wait_ms),
            }
        return out


def _r(x: float) -> float:
    return round(float(x), 3)


def top_cause(findings: list[Finding]) -> Finding | None:
    """A rank's own costliest cause: not the communication it waits in, not the imbalance."""
    own = [f for f in findings if f.id not in ("communication", "imbalance")
           and f.severity in ("warning", "critical")]
    return max(own, key=lambda f: f.cost_s) if own else None


def straggler_cause(rows: list[RankRow], s: RankRow) -> str | None:
    """What the straggler did instead: the cause it pays for most *beyond what the other ranks
    pay for the same cause* (a DataLoader every rank waits on is not why one rank is late),
    else slower compute, else nothing that stands out."""
    others = [r for r in rows if r is not s]
    best, best_excess = None, 0.0
    for cause, ms in s.causes.items():
        excess = ms - statistics.median(r.causes.get(cause, 0.0) for r in others)
        if excess > best_excess:
            best, best_excess = cause, excess
    if best is not None and best_excess >= WARNING_SHARE * s.step_ms:
        return best
    others_compute = statistics.median(r.compute_ms for r in others)
    if s.compute_ms - others_compute >= WARNING_SHARE * s.step_ms:
        return "slower compute on its device"
    return None


def compare(metrics: list[TraceMetrics], labels: list[str], files: list[str],
            findings: list[list[Finding]]) -> CrossRank:
    """The ranks of one job (see the module docstring)."""
    common = _common_steps(metrics)
    rows = [_row(m, label, f, common, fs) for m, label, f, fs in zip(metrics, labels, files,
                                                                        findings)]
    cross = CrossRank(rows, "none", common)
    if len(metrics) < 2 or not common:
        return cross
    if _same_clock(metrics, common):
        _by_collectives(cross, metrics, common)
    if cross.method == "none":
        _by_work(cross, metrics, common)
    _findings(cross, metrics)
    return cross


def chance_of_last(ranks: int, trials: int, times_last: int) -> float:
    """How likely some rank of ``ranks`` is last in ``times_last`` or more of ``trials`` when
    each is equally likely to be last (a union bound over the ranks)."""
    if ranks < 2 or trials < 1:
        return 1.0
    p = 1.0 / ranks
    tail = sum(math.comb(trials, j) * p ** j * (1 - p) ** (trials - j)
               for j in range(max(0, times_last), trials + 1))
    return min(1.0, ranks * tail)


def _steps_by_name(m: TraceMetrics) -> dict:
    return {s.name: (s, row) for s, row in zip(m.steps, m.per_step_roles_ms)}


def _common_steps(metrics: list[TraceMetrics]) -> list[str]:
    if not metrics:
        return []
    names = [s.name for s in metrics[0].steps]
    keep = set(names)
    for m in metrics[1:]:
        keep &= {s.name for s in m.steps}
    return [n for n in names if n in keep]


def _row(m: TraceMetrics, label: str, file: str, common: list[str],
         findings: list[Finding]) -> RankRow:
    by_name = _steps_by_name(m)
    rows = [by_name[n][1] for n in common if n in by_name]
    n = max(1, len(rows))
    cause = top_cause(findings)
    comm = 0.0
    windows = [(by_name[c][0].start, by_name[c][0].end) for c in common if c in by_name]
    for s, e, _stream in m.details.get("collectives", []):
        comm += total(intersect([(s, e)], merge(windows)))
    return RankRow(
        label=label, rank=m.rank, file=file, steps=len(rows),
        step_ms=sum(r["total"] for r in rows) / n,
        compute_ms=sum(r.get("compute", 0.0) for r in rows) / n,
        exposed_comm_ms=sum(r.get("communication", 0.0) for r in rows) / n,
        comm_ms=comm / 1e3 / n,
        top_cause=cause.id if cause else None,
        causes={f.id: f.cost_s * 1e3 / n for f in findings
                if f.id not in ("communication", "imbalance") and f.cost_s > 0},
    )


def _same_clock(metrics: list[TraceMetrics], common: list[str]) -> bool:
    """The ranks' step k overlap in time: their clocks agree (ranks of one node)."""
    spans = []
    for m in metrics:
        by_name = _steps_by_name(m)
        s = [by_name[n][0] for n in common]
        spans.append((s[0].start, s[-1].end))
    start = max(a for a, _ in spans)
    end = min(b for _, b in spans)
    longest = max(b - a for a, b in spans)
    return end > start and (end - start) >= 0.5 * longest


def _collectives_in_steps(m: TraceMetrics, common: list[str]) -> dict:
    """step name -> {stream: [(start, end)] in start order}."""
    by_name = _steps_by_name(m)
    out: dict = {}
    colls = sorted(m.details.get("collectives", []))
    for name in common:
        step = by_name[name][0]
        per: dict = {}
        for s, e, stream in colls:
            if step.start <= s < step.end:
                per.setdefault(stream, []).append((s, e))
        out[name] = per
    return out


def _by_collectives(cross: CrossRank, metrics: list[TraceMetrics], common: list[str]) -> None:
    per_rank = [_collectives_in_steps(m, common) for m in metrics]
    n = len(metrics)
    lateness = [0.0] * n
    spread_sum = 0.0
    last_in = [0] * n
    waits: list[list[tuple[float, float]]] = [[] for _ in range(n)]
    step_last: dict[str, list[float]] = {}
    matched = 0
    for name in common:
        streams = [set(p[name]) for p in per_rank]
        same = all(s == streams[0] for s in streams)
        groups = (
            [[p[name].get(st, []) for p in per_rank] for st in sorted(streams[0], key=str)]
            if same else
            [[sorted(c for lst in p[name].values() for c in lst) for p in per_rank]]
        )
        step_weight = [0.0] * n
        for lists in groups:
            count = min(len(lst) for lst in lists)
            for i in range(count):
                starts = [lists[r][i][0] for r in range(n)]
                ends = [lists[r][i][1] for r in range(n)]
                first, last = min(starts), max(starts)
                spread = last - first
                matched += 1
                if spread < JITTER_US:
                    continue
                spread_sum += spread
                late = starts.index(last)
                last_in[late] += 1
                step_weight[late] += spread
                for r in range(n):
                    lateness[r] += starts[r] - first
                    w_end = min(last, ends[r])
                    if w_end > starts[r]:
                        waits[r].append((starts[r], w_end))
        step_last[name] = step_weight
    cross.collectives = matched
    if not matched:
        return
    cross.method = "collective start times"
    for r, row in enumerate(cross.rows):
        m = metrics[r]
        wait_r = merge(waits[r])
        exposed = m.attribution.ranges("communication") if m.attribution else []
        steps = max(1, row.steps)
        row.wait_ms = total(wait_r) / 1e3 / steps
        row.exposed_wait_ms = total(intersect(wait_r, merge(exposed))) / 1e3 / steps
        row.straggler_score = lateness[r] / spread_sum if spread_sum else 0.0
        row.last_in = last_in[r]
    if not spread_sum:
        return
    best = max(range(n), key=lambda r: cross.rows[r].straggler_score)
    if cross.rows[best].straggler_score < STRAGGLER_SCORE or n < 2:
        return
    steps_last = sum(1 for name in common
                     if max(range(n), key=step_last[name].__getitem__) == best
                     and step_last[name][best] > 0)
    late_collectives = sum(last_in)
    chance = (chance_of_last(n, len(common), steps_last) if len(common) > 1
              else chance_of_last(n, late_collectives, last_in[best]))
    if chance > CHANCE_MAX:
        return
    cross.straggler = cross.rows[best]
    cross.steps_last = steps_last
    others = [row.wait_ms for r, row in enumerate(cross.rows) if r != best]
    cross.others_wait_ms = statistics.median(others) if others else 0.0
    cross.late_ms = cross.others_wait_ms  # per step: how late it is, as the others feel it


def _by_work(cross: CrossRank, metrics: list[TraceMetrics], common: list[str]) -> None:
    """Clocks that do not agree: the rank with the most work per step (step time minus time in
    collectives) in most steps holds the others back."""
    n = len(metrics)
    works = []
    for m in metrics:
        by_name = _steps_by_name(m)
        works.append([by_name[c][1]["total"] - by_name[c][1].get("communication", 0.0)
                      for c in common])
    slowest = [0] * n
    for k in range(len(common)):
        col = [works[r][k] for r in range(n)]
        slowest[max(range(n), key=col.__getitem__)] += 1
    best = max(range(n), key=slowest.__getitem__)
    med = [statistics.median(w) for w in works]
    lo, hi = min(med), max(med)
    for r, row in enumerate(cross.rows):
        row.straggler_score = (med[r] - lo) / (hi - lo) if hi > lo else 0.0
        row.last_in = slowest[r]
    cross.method = "per-step work"
    if chance_of_last(n, len(common), slowest[best]) > CHANCE_MAX or hi <= lo:
        return
    cross.straggler = cross.rows[best]
    cross.steps_last = slowest[best]
    others = [m_ for r, m_ in enumerate(med) if r != best]
    cross.others_wait_ms = med[best] - statistics.median(others)
    cross.late_ms = cross.others_wait_ms


def _findings(cross: CrossRank, metrics: list[TraceMetrics]) -> None:
    s = cross.straggler
    if s is None:
        return
    step_ms = statistics.median(r.step_ms for r in cross.rows) or 1.0
    share = cross.others_wait_ms / step_ms
    if share < WARNING_SHARE:
        return
    n_others = len(cross.rows) - 1
    cause = cross.cause = straggler_cause(cross.rows, s)
    cause_txt = (f"what it does instead: {cause}, more of it than the other ranks have"
                 if cause else "no cause of its own stands out beyond what the other ranks pay "
                 "(other processes on its CPU cores, or its GPU, can make a rank late)")
    m = metrics[cross.rows.index(s)]
    dev = m.devices[0].index if m.gpu_present and len(m.devices) == 1 else None
    how = (f"it started {s.last_in} of {cross.collectives} matched collectives last"
           if cross.method == "collective start times"
           else f"it did the most work in {s.last_in} of {len(cross.steps)} steps")
    cross.findings.append(Finding(
        id="imbalance",
        severity=severity_for(share),
        title=f"{s.label} holds the job back ({cause or 'cause unknown'}): the other "
              f"{n_others} rank(s) wait {ms_h(cross.others_wait_ms)} per step for it",
        evidence=(
            f"{how}, last in {cross.steps_last} of {len(cross.steps)} steps (straggler score "
            f"{s.straggler_score:.2f}); the others wait {ms_h(cross.others_wait_ms)} per step "
            f"inside collectives ({100 * share:.1f}% of the step); {cause_txt}."
        ),
        fix=(
            f"Fix {s.label}'s own bottleneck ({cause or 'see its report'}) and the whole job "
            "speeds up; even out the work per rank (equal shards with DistributedSampler, "
            "drop_last=True, length-grouped batches); check that rank's GPU and host for "
            "throttling or other processes."
        ),
        next_step="gputop analyze " + " ".join(r.file for r in cross.rows),
        cost_s=cross.others_wait_ms * max(1, s.steps) / 1e3,
        gpu=dev,
    ))


def split_communication(finding: Finding, row: RankRow, straggler: RankRow | None) -> Finding:
    """A rank's communication finding, with its exposed time split into waiting for the late
    rank and moving data."""
    if row.exposed_comm_ms <= 0:
        return finding
    who = straggler.label if straggler is not None and straggler is not row else "a late rank"
    extra = (f" Of the {ms_h(row.exposed_comm_ms)} exposed per step, {ms_h(row.exposed_wait_ms)} "
             f"is waiting for {who} and {ms_h(row.exposed_bandwidth_ms)} moves data (bandwidth).")
    return replace(finding, evidence=finding.evidence.rstrip() + extra)
