"""What changed between two traces of one job (``gputop analyze --compare BASE NEW``).

Both sides are read per step (traces of different step counts compare), from the analyses'
metrics: the step time and its change split into the idle time by cause (input pipeline,
syncs, launch overhead, ...) and the busy time by class (compute, copies, communication); the
operators and kernels whose time a step changed most, with their calls; the ones new or gone;
the findings that appeared or cleared; and a one-line verdict ("NEW is 37 % slower a step:
+52 ms of DataLoader wait; compute unchanged"). Several traces on one side (the ranks of a
job, a tensorboard_trace_handler folder) are averaged per step.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from gputop.diagnostics.findings import SEVERITY_RANK

BUSY = {"compute": "compute", "communication": "communication",
        "memcpy": "host-device copies", "memset": "memsets"}
IDLE = {"dataloader": "DataLoader wait", "sync": "host syncs (.item() etc.)",
        "launch": "launch overhead", "host": "host Python time", "copy": "blocking copies",
        "allocator": "allocator calls", "startup": "start-up", "queued": "queued work",
        "unprofiled": "unprofiled host time", "unrecorded": "unrecorded GPU time"}
# A change smaller than this share of the base step (or 0.05 ms) is within step-to-step noise.
NOISE_SHARE = 0.03
MAX_ROWS = 8


def _num(value: Any) -> float:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) \
        and value == value else 0.0


def _steps(m: dict[str, Any]) -> int:
    n = (m.get("steps") or {}).get("count")
    return n if isinstance(n, int) and n > 0 else 1


def side(analyses: Sequence[Any]) -> dict[str, Any]:
    """One side's per-step figures, averaged over its traces (``TraceAnalysis``es)."""
    n = len(analyses)
    parts: dict[str, float] = {}
    ops: dict[str, dict[str, float]] = {}
    kernels: dict[str, dict[str, float]] = {}
    op_floor = kernel_floor = 0.0
    step_ms = 0.0
    steps, devices, ranks = [], set(), set()
    findings: dict[str, str] = {}
    for a in analyses:
        m = a.metrics
        k = _steps(m)
        steps.append(k)
        ms = (m.get("step_breakdown") or {}).get("ms") or {}
        step_ms += _num(ms.get("total")) / k / n
        for key in (*BUSY, *IDLE):
            parts[key] = parts.get(key, 0.0) + _num(ms.get(key)) / k / n
        for rows, table, field in ((m.get("top_ops") or [], ops, "self_ms"),
                                   (m.get("top_kernels") or [], kernels, "ms")):
            for r in rows:
                if isinstance(r, dict) and isinstance(r.get("name"), str):
                    t = table.setdefault(r["name"], {"ms": 0.0, "calls": 0.0})
                    t["ms"] += _num(r.get(field)) / k / n
                    t["calls"] += _num(r.get("calls")) / k / n
        # The least a listed operator took: one missing from a full list took less than it.
        if len(m.get("top_ops") or []) >= 10:
            op_floor = max(op_floor, min(_num(r.get("self_ms")) for r in m["top_ops"]) / k)
        if len(m.get("top_kernels") or []) >= 10:
            kernel_floor = max(kernel_floor, min(_num(r.get("ms")) for r in m["top_kernels"]) / k)
        trace = m.get("trace") or {}
        if trace.get("device"):
            devices.add(str(trace["device"]))
        if trace.get("rank") is not None:
            ranks.add(trace["rank"])
        for f in a.findings:
            if SEVERITY_RANK[f.severity] >= SEVERITY_RANK["warning"]:
                findings.setdefault(f.id, f.title)
    return {"files": [a.file for a in analyses], "traces": n, "steps": steps,
            "step_ms": step_ms, "parts": parts, "ops": ops, "kernels": kernels,
            "op_floor": op_floor, "kernel_floor": kernel_floor, "devices": sorted(devices),
            "ranks": sorted(ranks), "findings": findings}


def _r(x: float) -> float:
    return round(x, 3)


def _changes(base: dict[str, dict[str, float]], new: dict[str, dict[str, float]],
             base_floor: float, new_floor: float, noise: float) -> dict[str, list[dict]]:
    changed, appeared, vanished = [], [], []
    for name in {*base, *new}:
        b, n = base.get(name), new.get(name)
        if b and n:
            delta = n["ms"] - b["ms"]
            if abs(delta) >= noise:
                changed.append({"name": name, "base_ms": _r(b["ms"]), "new_ms": _r(n["ms"]),
                                "delta_ms": _r(delta), "base_calls": _r(b["calls"]),
                                "new_calls": _r(n["calls"])})
        elif n and n["ms"] >= max(base_floor, noise):
            # Absent from BASE's list while it would have made it (or the list was not full).
            appeared.append({"name": name, "new_ms": _r(n["ms"]), "new_calls": _r(n["calls"]),
                             "base_ms_at_most": _r(base_floor)})
        elif b and b["ms"] >= max(new_floor, noise):
            vanished.append({"name": name, "base_ms": _r(b["ms"]), "base_calls": _r(b["calls"]),
                             "new_ms_at_most": _r(new_floor)})
    changed.sort(key=lambda r: -abs(r["delta_ms"]))
    appeared.sort(key=lambda r: -r["new_ms"])
    vanished.sort(key=lambda r: -r["base_ms"])
    return {"changed": changed[:MAX_ROWS], "new": appeared[:MAX_ROWS],
            "vanished": vanished[:MAX_ROWS]}


def _fmt_ms(ms: float) -> str:
    return f"{ms:+.0f} ms" if abs(ms) >= 10 else f"{ms:+.1f} ms" if abs(ms) >= 0.1 \
        else f"{ms * 1000:+.0f} us"


def _calls_note(r: dict[str, Any]) -> str:
    b, n = r.get("base_calls") or 0, r.get("new_calls") or 0
    if b and n and (n / b >= 1.5 or b / n >= 1.5):
        return f", {n / b:.1f}x the calls" if n > b else f", {b / n:.1f}x fewer calls"
    return ""


def compare(base_analyses: Sequence[Any], new_analyses: Sequence[Any]) -> dict[str, Any]:
    base, new = side(base_analyses), side(new_analyses)
    b_step, n_step = base["step_ms"], new["step_ms"]
    noise = max(NOISE_SHARE * b_step, 0.05)
    delta = n_step - b_step
    rows = []
    for key, words in (*IDLE.items(), *BUSY.items()):
        b, n = base["parts"].get(key, 0.0), new["parts"].get(key, 0.0)
        rows.append({"part": key, "what": words, "kind": "busy" if key in BUSY else "idle",
                     "base_ms": _r(b), "new_ms": _r(n), "delta_ms": _r(n - b)})
    moved = sorted((r for r in rows if abs(r["delta_ms"]) >= noise),
                   key=lambda r: -abs(r["delta_ms"]))
    pct = delta / b_step * 100 if b_step > 0 else 0.0
    if abs(delta) < noise:
        head = f"NEW takes the same time a step as BASE ({n_step:.1f} vs {b_step:.1f} ms)"
    else:
        head = (f"NEW is {abs(pct):.0f} % {'slower' if delta > 0 else 'faster'} a step "
                f"({b_step:.1f} -> {n_step:.1f} ms)")
    causes = [f"{_fmt_ms(r['delta_ms'])} of {r['what']}" for r in moved[:2]]
    compute = next(r for r in rows if r["part"] == "compute")
    tail = "compute unchanged" if abs(compute["delta_ms"]) < noise and not any(
        r["part"] == "compute" for r in moved[:2]) else ""
    verdict = head + (": " + ", ".join(causes) if causes else "") + (f"; {tail}" if tail else "")
    notes = []
    if base["steps"] != new["steps"]:
        notes.append(f"BASE has {'+'.join(map(str, base['steps']))} step(s), NEW "
                     f"{'+'.join(map(str, new['steps']))}: compared per step")
    if base["devices"] and new["devices"] and base["devices"] != new["devices"]:
        notes.append(f"the GPUs differ: BASE {', '.join(base['devices'])}, NEW "
                     f"{', '.join(new['devices'])}")
    if base["traces"] != new["traces"] or base["ranks"] != new["ranks"]:
        notes.append(f"BASE has {base['traces']} trace(s)"
                     + (f" (ranks {', '.join(map(str, base['ranks']))})" if base["ranks"] else "")
                     + f", NEW {new['traces']}"
                     + (f" (ranks {', '.join(map(str, new['ranks']))})" if new["ranks"] else "")
                     + ": each side averaged per step")
    return {
        "kind": "compare",
        "base": {"files": base["files"], "steps": base["steps"], "step_ms": _r(b_step),
                 "devices": base["devices"]},
        "new": {"files": new["files"], "steps": new["steps"], "step_ms": _r(n_step),
                "devices": new["devices"]},
        "delta_ms": _r(delta),
        "delta_pct": round(pct, 1),
        "verdict": verdict,
        "parts": rows,
        "ops": _changes(base["ops"], new["ops"], base["op_floor"], new["op_floor"], noise / 5),
        "kernels": _changes(base["kernels"], new["kernels"], base["kernel_floor"],
                            new["kernel_floor"], noise / 5),
        "findings": {
            "appeared": [{"id": k, "title": t} for k, t in new["findings"].items()
                         if k not in base["findings"]],
            "cleared": [{"id": k, "title": t} for k, t in base["findings"].items()
                        if k not in new["findings"]],
            "both": sorted(set(base["findings"]) & set(new["findings"])),
        },
        "notes": notes,
    }


def format_compare(c: dict[str, Any], width: int = 100) -> str:
    from gputop.core.format import safe_text

    def name(s: str, n: int = 60) -> str:
        s = safe_text(s)
        return s if len(s) <= n else s[:n - 1] + "…"

    b, n = c["base"], c["new"]
    out = [safe_text(c["verdict"]), "",
           f"BASE {b['step_ms']:9.1f} ms a step  ({name(', '.join(map(os.path.basename, b['files'])), width - 30)})",
           f"NEW  {n['step_ms']:9.1f} ms a step  ({name(', '.join(map(os.path.basename, n['files'])), width - 30)})",
           f"change {c['delta_ms']:+.1f} ms ({c['delta_pct']:+.0f} %)", "",
           f"{'a step':<36}{'BASE ms':>10}{'NEW ms':>10}{'change':>10}"]
    for kind, title in (("idle", "idle, by cause"), ("busy", "busy, by class")):
        out.append(f"  {title}")
        for r in c["parts"]:
            if r["kind"] == kind and (r["base_ms"] or r["new_ms"]):
                out.append(f"    {r['what']:<32}{r['base_ms']:>10.1f}{r['new_ms']:>10.1f}"
                           f"{r['delta_ms']:>+10.1f}")
    for what in ("ops", "kernels"):
        part = c[what]
        label = "operators (self time)" if what == "ops" else "kernels"
        if part["changed"]:
            out += ["", f"{label} that changed most, a step:"]
            out += [f"  {_fmt_ms(r['delta_ms']):>9}  {name(r['name'])}: {r['base_ms']:.2f} -> "
                    f"{r['new_ms']:.2f} ms, {r['base_calls']:g} -> {r['new_calls']:g} calls"
                    f"{_calls_note(r)}" for r in part["changed"]]
        if part["new"]:
            out.append(f"{label} new in NEW: " + "; ".join(
                f"{name(r['name'], 50)} {r['new_ms']:.2f} ms ({r['new_calls']:g} calls)"
                for r in part["new"][:5]))
        if part["vanished"]:
            out.append(f"{label} gone from NEW: " + "; ".join(
                f"{name(r['name'], 50)} {r['base_ms']:.2f} ms ({r['base_calls']:g} calls)"
                for r in part["vanished"][:5]))
    f = c["findings"]
    out.append("")
    out.append("findings appeared: " + (", ".join(x["id"] for x in f["appeared"]) or "none"))
    out.append("findings cleared: " + (", ".join(x["id"] for x in f["cleared"]) or "none"))
    if f["both"]:
        out.append("findings in both: " + ", ".join(f["both"]))
    out += [safe_text(f"note: {note}") for note in c["notes"]]
    return "\n".join(out) + "\n"
