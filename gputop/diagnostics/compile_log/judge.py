"""The ranks of one job's torch.compile logs -> findings, in the live findings' ids and words.

``recompiles``, ``graph-breaks`` and ``compile-fallback`` as the live rules name them from the
agent (``diagnostics/live/compile.py``, whose fixes they share), each naming the ranks it was
seen on when the job has several; ``desync`` when compiled graphs' collective schedules differ
between ranks (a rank that calls a collective the others do not, or with another shape, hangs
the job the first time the graphs run).
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from gputop.core.guard_change import root_function
from gputop.diagnostics.compile_log.parse import Compile, RankLog
from gputop.diagnostics.findings import SEVERITY_RANK, Finding, verdict
from gputop.diagnostics.live.compile import _explain_break, _recompile_fix

MAX_GUARDS = 64
NEXT_STEP = ("TORCH_LOGS=recompiles,graph_breaks python train.py for the live view, or "
             "`tlparse LOG` for each compile's graphs and guards")


@dataclass
class JobFinding:
    finding: Finding
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {**self.finding.to_json(), **self.extra}


def place(file: str, line: int | None) -> str:
    name = os.path.basename(file) or "?"
    return f"{name}:{line}" if line is not None else name


def _label(log: RankLog, i: int) -> str:
    return f"rank {log.rank}" if log.rank is not None else f"log {i + 1}"


def _ranks(names: list[str]) -> str:
    if len(names) > 8:
        return ", ".join(names[:8]) + f" and {len(names) - 8} more"
    return ", ".join(names)


def _ids(logs: list[RankLog]) -> list[str]:
    ranked = all(g.rank is not None for g in logs) and len({g.rank for g in logs}) == len(logs)
    return [_label(g, i) if ranked else os.path.basename(g.path) for i, g in enumerate(logs)]


def judge(logs: list[RankLog]) -> list[JobFinding]:
    labels = _ids(logs)
    out = _recompiles(logs, labels) + _fallbacks(logs, labels) + _breaks(logs, labels)
    out += desync(logs, labels)
    return sorted(out, key=lambda j: (-SEVERITY_RANK[j.finding.severity], -j.finding.cost_s))


def job_verdict(found: list[JobFinding]) -> str:
    return verdict([j.finding for j in found])


def _key(c: Compile) -> tuple[str, str]:
    return (os.path.basename(c.file), root_function(c.function))


def _recompiles(logs: list[RankLog], labels: list[str]) -> list[JobFinding]:
    # Per user function and rank: a recompile of a function also recompiles the resume
    # functions after its graph breaks, so its count is the most of any of its frames.
    per: dict[tuple[str, str], dict[int, dict[str, list[Compile]]]] = {}
    for i, log in enumerate(logs):
        for c in log.compiles:
            if c.attempt > 0 and not c.fallback:
                per.setdefault(_key(c), {}).setdefault(i, {}).setdefault(c.frame, []).append(c)
    out = []
    for (_, name), by_rank in sorted(per.items(), key=lambda kv: -sum(
            max(len(v) for v in r.values()) for r in kv[1].values()))[:4]:
        counts = {i: max(len(v) for v in frames.values()) for i, frames in by_rank.items()}
        first = min((c for frames in by_rank.values() for cs in frames.values() for c in cs
                     if c.function == name), default=None, key=lambda c: c.attempt) or next(
            c for frames in by_rank.values() for cs in frames.values() for c in cs)
        guards = []
        for i, frames in sorted(by_rank.items()):
            own = [cs for cs in frames.values() if cs[0].function == name]
            main = max(own or list(frames.values()), key=len)
            for c in main:
                if c.recompile and len(guards) < MAX_GUARDS:
                    guards.append({**({"rank": logs[i].rank} if logs[i].rank is not None
                                      else {"file": logs[i].path}),
                                   "compile_id": c.compile_id, "change": c.recompile["text"],
                                   **{k: v for k, v in c.recompile.items() if k != "text"}})
        texts = list(dict.fromkeys(g["change"] for g in guards))
        change = "; ".join(texts[:6]) + (f"; and {len(texts) - 6} more" if len(texts) > 6 else "")
        count = max(counts.values())
        seconds = sum(c.seconds for frames in by_rank.values() for cs in frames.values()
                      for c in cs)
        limit = next((g.recompile_limit for g in logs if g.recompile_limit), None)
        where = place(first.file, first.line)
        on, off = [labels[i] for i in sorted(counts)], [
            labels[i] for i in range(len(logs)) if i not in counts]
        multi = len(logs) > 1
        spread = (f" on {_ranks([f'{labels[i]} ({n})' for i, n in sorted(counts.items())])}"
                  + (f"; {_ranks(off)} did not (the ranks saw different inputs)" if off else "")
                  if multi else "")
        out.append(JobFinding(Finding(
            id="recompiles",
            severity="critical" if limit and count >= max(2, limit // 2) else "warning",
            title=f"`{name}` recompiled {count} time(s) ({where})"
            + (f" on {_ranks(on)}" if multi else ""),
            evidence=(f"{where} `{name}` recompiled {count} time(s){spread}: {change or 'a guard failed'}"
                      + (f" (recompile limit {limit})" if limit else "")
                      + f"; {seconds:.1f} s compiling them, each blocking its step"),
            fix=_recompile_fix(change),
            next_step=NEXT_STEP,
            cost_s=seconds,
        ), {"function": name, "file": first.file, "line": first.line, "count": count,
            "ranks": [logs[i].rank for i in sorted(counts)] if multi else [],
            "ranks_without": [logs[i].rank for i in range(len(logs)) if i not in counts]
            if multi else [], "guards": guards}))
    return out


def _fallbacks(logs: list[RankLog], labels: list[str]) -> list[JobFinding]:
    fallen: dict[tuple[str, str], list[tuple[int, Compile]]] = {}
    for i, log in enumerate(logs):
        for c in log.compiles:
            if c.fallback:
                fallen.setdefault(_key(c), []).append((i, c))
    out = []
    for (_, name), hits in list(fallen.items())[:4]:
        i, c = hits[0]
        compiles = sum(1 for x in logs[i].compiles if x.frame == c.frame and not x.fallback)
        on = list(dict.fromkeys(labels[j] for j, _ in hits))
        limit = logs[i].recompile_limit
        last = c.recompile["text"] if c.recompile else ""
        out.append(JobFinding(Finding(
            id="compile-fallback",
            severity="critical",
            title=f"`{name}` hit the recompile limit and runs eager ({place(c.file, c.line)})",
            evidence=(f"{place(c.file, c.line)} `{name}` was compiled {compiles} time(s) and "
                      "reached torch._dynamo.config.recompile_limit"
                      + (f" ({limit})" if limit else "")
                      + (f"; the last change: {last}" if last else "")
                      + ": new inputs now run it uncompiled (eager)"
                      + (f"; on {_ranks(on)}" if len(logs) > 1 else "")),
            fix=("Remove the cause of the recompiles (see the recompiles finding: drop_last=True, "
                 "bucket padding, mark_dynamic, dynamic=True); raise "
                 "torch._dynamo.config.recompile_limit only if the variants are few and needed"),
            next_step=NEXT_STEP,
        ), {"function": name, "file": c.file, "line": c.line, "compile_id": c.compile_id,
            "ranks": [logs[j].rank for j, _ in hits] if len(logs) > 1 else []}))
    return out


def _breaks(logs: list[RankLog], labels: list[str]) -> list[JobFinding]:
    merged: dict[tuple[str, str, int | None], dict[str, Any]] = {}
    for i, log in enumerate(logs):
        for b in log.breaks.values():
            row = merged.setdefault((b.reason, os.path.basename(b.file), b.line), {
                "reason": b.reason, "file": b.file, "line": b.line, "function": b.function,
                "code": b.code, "count": 0, "ranks": []})
            row["count"] += b.count
            row["ranks"].append(i)
    if not merged:
        return []
    rows = sorted(merged.values(), key=lambda r: -r["count"])[:12]
    parts, fixes = [], {}
    for r in rows:
        what, fix = _explain_break(r["reason"], r["code"])
        parts.append(f"{what} at {place(r['file'], r['line'])} in `{r['function']}`"
                     + (f" (`{r['code'][:80]}`)" if r["code"] else "")
                     + f", in {r['count']} compile(s)"
                     + (f" on {_ranks([labels[i] for i in r['ranks']])}" if len(logs) > 1 else ""))
        fixes.setdefault(what, fix)
    n = len(merged)
    return [JobFinding(Finding(
        id="graph-breaks",
        severity="warning",
        title=f"{n} graph break(s) in compiled code ({parts[0].split(' in `')[0]})",
        evidence=(f"{n} graph break(s), each taken on every call (a return to Python and a "
                  "graph boundary per step): " + "; ".join(parts)),
        fix="; ".join(f"{what}: {fix}" for what, fix in fixes.items()),
        next_step=NEXT_STEP,
    ), {"breaks": [{**{k: v for k, v in r.items() if k != "ranks"},
                    "ranks": [logs[i].rank for i in r["ranks"]] if len(logs) > 1 else []}
                   for r in rows]})]


def _first_difference(a: list[str], b: list[str]) -> tuple[int, str, str]:
    for k in range(max(len(a), len(b))):
        x = a[k] if k < len(a) else "nothing"
        y = b[k] if k < len(b) else "nothing"
        if x != y:
            return k, x, y
    return -1, "", ""


def desync(logs: list[RankLog], labels: list[str]) -> list[JobFinding]:
    """Graphs of one compile id (or a rank's recompile of a frame) whose collectives differ
    from the most common schedule among the ranks."""
    if len(logs) < 2:
        return []
    ids = sorted({cid for g in logs for cid in g.schedules},
                 key=lambda s: tuple(int(p) if p.isdigit() else 0 for p in s.split("/")))
    odd: dict[int, tuple[str, int, str, str, list[int]]] = {}
    for cid in ids:
        have = {i: tuple(g.schedules[cid]) for i, g in enumerate(logs) if cid in g.schedules}
        frame = cid.split("/")[0]
        # A rank that recompiled a frame runs its new graph while the others run their
        # first: compare it with the schedules the other ranks have for that frame.
        common = Counter(have.values()).most_common()
        if len(have) < len(logs):
            others = Counter(tuple(g.schedules[c]) for j, g in enumerate(logs) if j not in have
                             for c in g.schedules if c.split("/")[0] == frame)
            common = (others + Counter(have.values())).most_common()
        if len(common) < 2:  # every rank's graph calls the same collectives
            continue
        expected = list(common[0][0])
        for i, sched in have.items():
            if list(sched) != expected and i not in odd:
                k, theirs, ours = _first_difference(list(sched), expected)
                peers = [j for j, s in have.items() if list(s) == expected] or [
                    j for j in range(len(logs)) if j not in have]
                odd[i] = (cid, k, theirs, ours, peers)
    if not odd:
        return []
    ranks = sorted(odd)
    i = ranks[0]
    cid, k, theirs, ours, peers = odd[i]
    names = _ranks([labels[r] for r in ranks])
    peer_names = _ranks([labels[p] for p in peers[:4]]) or "the other ranks"
    return [JobFinding(Finding(
        id="desync",
        severity="critical",
        title=f"{names}: compiled graph {cid} calls other collectives than {peer_names}",
        evidence=(f"the collective schedule of {labels[i]}'s compiled graph {cid} first differs at "
                  f"collective #{k + 1}: {theirs} where {peer_names} "
                  + (f"{'has' if len(peers) == 1 else 'have'} none" if ours == "nothing" else
                     f"{'calls' if len(peers) == 1 else 'call'} {ours}")
                  + "".join(f"; {labels[r]} (graph {odd[r][0]}): {odd[r][2]} where the others "
                            f"call {odd[r][3]}" for r in ranks[1:4])
                  + "; a collective one rank calls and the others do not (or with another "
                  "size) hangs the job the first time these graphs run"),
        fix=("Make every rank trace the same collectives: no rank-dependent branches or shapes "
             "around collectives in compiled code (same batch shapes on every rank, "
             "drop_last=True, the same config), or mark the shapes dynamic so that every rank "
             "compiles one graph"),
        next_step=("gputop analyze on the Flight Recorder dumps (TORCH_NCCL_TRACE_BUFFER_SIZE) "
                   "once it hangs; `tlparse LOG` to read each rank's graph"),
    ), {"ranks": [logs[r].rank for r in ranks], "graph": cid, "index": k,
        "collective": theirs, "expected": ours,
        "differences": [{"rank": logs[r].rank, "graph": odd[r][0], "index": odd[r][1],
                         "collective": odd[r][2], "expected": odd[r][3]} for r in ranks]})]
