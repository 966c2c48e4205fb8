"""torch.compile in a trace: compiled regions, dynamo's guard checks, compilation in the window.

torch's profiler records, for a compiled job:

* ``Torch-Compiled Region: F/A`` (``cpu_op``, torch 2.2+): each call of compiled code, F the
  frame, A its compile attempt (A > 0: a recompiled variant);
* ``TorchDynamo Cache Lookup`` (``cpu_op``): dynamo checking a frame's guards;
* ``dynamo`` / ``entire_frame_compile`` and ``entire_backward_compile`` (``cpu_op``, torch
  2.4+, from ``dynamo_timed``): compilation while the profiler ran, with a
  ``dynamo_data: compile_id=F/A`` (or ``compile_attempt_N_data: compile_id=F/A``) annotation
  naming what was compiled; the host's ``ProfilerStep#N`` it falls in names the step.

``compiled_summary`` names the time in each within the analysed window, and the compilations
inside the captured steps (``recompilations``: attempt > 0); ``compiled_lines`` renders them for
`gputop analyze`. Pure: the trace's events in, a small dict out.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from gputop.diagnostics.trace.loading.load import Event

REGION = "Torch-Compiled Region"
LOOKUP = "TorchDynamo Cache Lookup"
COMPILES = {"entire_frame_compile": "forward", "entire_backward_compile": "backward"}
_ID = re.compile(r"compile_id=\[?(?P<frame>\d+)/(?P<attempt>\d+)")
MAX_LISTED = 8


def _merged_ms(spans: list[tuple[float, float]]) -> float:
    """The time covered by ``spans`` (nested regions counted once), in ms."""
    covered, end = 0.0, float("-inf")
    for start, stop in sorted(spans):
        if stop <= end:
            continue
        covered += stop - max(start, end)
        end = stop
    return covered / 1e3


def compiled_summary(cpu_ops: Sequence[Event], window: tuple[float, float],
                     steps: Sequence[Event] = ()) -> dict[str, Any] | None:
    """What the window spent in compiled code, guard checks and compilation; None when the
    trace shows no torch.compile."""
    w0, w1 = window
    regions: list[tuple[float, float]] = []
    lookups: list[tuple[float, float]] = []
    variants: set[str] = set()
    compiles: list[tuple[float, float, str]] = []
    ids: list[tuple[float, str, int]] = []
    for ev in cpu_ops:
        name = ev.name
        if not (name.startswith(REGION) or name == LOOKUP or name in COMPILES
                or "compile_id=" in name):
            continue
        start, end = ev.ts, ev.ts + ev.dur
        if end < w0 or start > w1:
            continue
        span = (max(start, w0), min(end, w1))
        if name.startswith(REGION):
            regions.append(span)
            variants.add(name[len(REGION):].lstrip(": ")[:16])
        elif name == LOOKUP:
            lookups.append(span)
        elif name in COMPILES:
            compiles.append((*span, COMPILES[name]))
        else:
            m = _ID.search(name)
            if m:
                ids.append((start, f"{m['frame']}/{m['attempt']}", int(m["attempt"])))
    if not (regions or lookups or compiles):
        return None
    window_ms = max(1e-9, (w1 - w0) / 1e3)
    listed = []
    for start, end, kind in sorted(compiles)[:MAX_LISTED]:
        # The compile id is annotated inside the compile: the first one in its span.
        cid = next((c for t, c, _ in ids if start <= t <= end), None)
        attempt = int(cid.split("/")[1]) if cid else None
        step = next((s.name[:40] for s in steps if s.ts <= start < s.ts + s.dur), None)
        listed.append({"kind": kind, "compile_id": cid, "recompile": bool(attempt),
                       "ms": round((end - start) / 1e3, 3), "step": step})
    compile_ms = _merged_ms([(s, e) for s, e, _ in compiles])
    return {
        "regions": len(regions),
        "region_ms": round(_merged_ms(regions), 3),
        "region_pct": round(100 * _merged_ms(regions) / window_ms, 2),
        "variants": sorted(variants)[:MAX_LISTED],
        "cache_lookups": len(lookups),
        "cache_lookup_ms": round(_merged_ms(lookups), 3),
        "compiles": len(compiles),
        "compile_ms": round(compile_ms, 3),
        "compile_pct": round(100 * compile_ms / window_ms, 2),
        "recompilations": sum(1 for c in listed if c["recompile"]),
        "compilations": listed,
    }


def compiled_lines(m: dict[str, Any]) -> list[str]:
    """`gputop analyze`'s lines on torch.compile (none for a trace without it)."""
    c = m.get("compiled")
    if not c:
        return []
    lines = [f"torch.compile: {c['region_ms']:.1f} ms in {c['regions']} compiled region call(s) "
             f"({c['region_pct']:.1f}% of the window; variants {', '.join(c['variants']) or '-'})"
             f", {c['cache_lookup_ms']:.2f} ms in {c['cache_lookups']} TorchDynamo Cache "
             "Lookup(s)"]
    if c["compiles"]:
        named = "; ".join(
            f"{x['kind']} {x['compile_id'] or '?'}"
            + (" (a recompile)" if x["recompile"] else "")
            + f" {x['ms']:.1f} ms" + (f" in {x['step']}" if x["step"] else "")
            for x in c["compilations"])
        lines.append(f"  compilation inside the window: {c['compile_ms']:.1f} ms "
                     f"({c['compile_pct']:.1f}%), {c['recompilations']} recompilation(s): "
                     f"{named}")
    return lines
