"""One job's torch.compile logs as a report: JSON, and text for the terminal."""

from __future__ import annotations

import os
import textwrap
from typing import Any

from gputop.core.guard_change import root_function
from gputop.diagnostics.compile_log.judge import JobFinding, job_verdict, judge, place
from gputop.diagnostics.compile_log.parse import RankLog

MAX_FRAMES = 32


def _frames(logs: list[RankLog]) -> list[dict[str, Any]]:
    """Compile time per user function (its resume functions with it), over the ranks."""
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    for log in logs:
        for c in log.compiles:
            name = root_function(c.function)
            row = rows.setdefault((os.path.basename(c.file), name), {
                "function": name, "file": c.file, "line": c.line, "compiles": 0,
                "recompiles": 0, "seconds": 0.0})
            if c.function == name:
                row["line"] = c.line
            row["compiles"] += 1
            row["recompiles"] += c.attempt > 0 and not c.fallback
            row["seconds"] += c.seconds
    out = sorted(rows.values(), key=lambda r: -r["seconds"])[:MAX_FRAMES]
    for r in out:
        r["seconds"] = round(r["seconds"], 3)
    return out


def _window(log: RankLog) -> float | None:
    """Seconds from the first compile's start to the end of the last (the job's start-up,
    for a job that compiles once)."""
    spans = [(c.start, c.start + c.seconds) for c in log.compiles if c.start is not None]
    if not spans:
        return None
    return max(e for _, e in spans) - min(s for s, _ in spans)


def build(label: str, logs: list[RankLog]) -> dict[str, Any]:
    found = judge(logs)
    total = sum(g.compile_s for g in logs)
    per_rank = []
    for g in logs:
        window = _window(g)
        per_rank.append({
            "rank": g.rank, "file": g.path, "torch": g.torch_version,
            "compiles": len(g.compiles) + g.compiles_dropped,
            "recompiles": sum(c.attempt > 0 and not c.fallback for c in g.compiles),
            "fallbacks": sum(c.fallback for c in g.compiles),
            "graph_breaks": len(g.breaks),
            "compile_s": round(g.compile_s, 3),
            "compile_window_s": round(window, 3) if window is not None else None,
            "compile_share_of_window": round(g.compile_s / window, 3) if window else None,
            "records": g.stats.records, "lines": g.stats.lines})
    notes = [f"{os.path.basename(g.path)}: {n}" for g in logs for n in g.stats.notes()]
    notes += [f"{os.path.basename(g.path)}: {g.compiles_dropped} compile(s) past the first "
              f"{len(g.compiles)} counted only" for g in logs if g.compiles_dropped]
    return {
        "kind": "torch-compile-log",
        "source": label,
        "files": [g.path for g in logs],
        "verdict": job_verdict(found),
        "metrics": {"compile_s": round(total, 3), "ranks": per_rank, "frames": _frames(logs)},
        "findings": [j.to_json() for j in found],
        "notes": notes,
        "_found": found,
    }


def format_text(report: dict[str, Any], width: int = 100) -> str:
    from gputop.core.format import safe_text

    wrap = textwrap.TextWrapper(width=width, subsequent_indent="    ")
    m = report["metrics"]
    out = [safe_text(f"torch.compile log: {report['source']}"),
           f"verdict: {report['verdict']}",
           f"compile time: {m['compile_s']:.1f} s in all"]
    for r in m["ranks"]:
        who = f"rank {r['rank']}" if r["rank"] is not None else os.path.basename(r["file"])
        share = (f", {r['compile_share_of_window'] * 100:.0f} % of the "
                 f"{r['compile_window_s']:.1f} s from its first compile to the end of its last"
                 if r["compile_share_of_window"] is not None else "")
        out.append(safe_text(f"  {who}: {r['compiles']} compile(s), {r['recompiles']} "
                             f"recompile(s), {r['graph_breaks']} graph break(s), "
                             f"{r['fallbacks']} fallback(s); {r['compile_s']:.1f} s{share}"))
    if m["frames"]:
        out.append("compile time per function:")
        for f in m["frames"][:10]:
            out.append(safe_text(f"  {f['seconds']:7.2f} s  {f['function']} "
                                 f"({place(f['file'], f['line'])}): {f['compiles']} "
                                 f"compile(s), {f['recompiles']} recompile(s)"))
    found: list[JobFinding] = report["_found"]
    if not found:
        out.append("no recompile, graph break, fallback or collective mismatch in the log")
    for j in found:
        f = j.finding
        out.append("")
        out += wrap.wrap(safe_text(f"[{f.severity}] {f.id}: {f.title}"))
        out += wrap.wrap(safe_text(f"  evidence: {f.evidence}"))
        out += wrap.wrap(safe_text(f"  fix: {f.fix}"))
        out += wrap.wrap(safe_text(f"  next: {f.next_step}"))
    for note in report["notes"]:
        out.append(safe_text(f"note: {note}"))
    return "\n".join(out) + "\n"
