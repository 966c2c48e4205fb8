"""torch.compile's health of a process, from its agent's ``compile`` status (issue 41).

The agent's reply is untrusted: every figure is checked and bounded here before it becomes a
``CompileHealth`` (``snapshot --json``'s ``compiled``, the process view's line). The live
findings (``diagnostics/live/compile.py``) read the agent's events themselves.
"""

from __future__ import annotations

import os
from typing import Any

from gputop.model import CompiledFunction, CompileHealth

MAX_FUNCTIONS = 16


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and \
        0 <= value < 2**31 else 0


def _seconds(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
        return 0.0
    return round(min(max(float(value), 0.0), 1e9), 3)


def _text(value: Any, limit: int) -> str | None:
    if not isinstance(value, str):
        return None
    return "".join(c if c.isprintable() else " " for c in value[:limit])


def compile_health(agent: dict[str, Any] | None) -> CompileHealth | None:
    """The process's CompileHealth, or None when its agent reports no torch.compile."""
    data = agent.get("compile") if isinstance(agent, dict) else None
    if not isinstance(data, dict):
        return None
    functions = []
    raw = data.get("functions")
    for f in raw[:MAX_FUNCTIONS] if isinstance(raw, list) else []:
        if not isinstance(f, dict):
            continue
        line = f.get("line")
        functions.append(CompiledFunction(
            function=_text(f.get("function"), 120) or "?",
            file=_text(f.get("file"), 300),
            line=line if isinstance(line, int) and not isinstance(line, bool)
            and 0 < line < 10**7 else None,
            compiles=_count(f.get("compiles")),
            recompiles=_count(f.get("recompiles")),
            fallback=f.get("fallback") is True,
        ))
    graphs = data.get("cudagraph")
    unavailable = data.get("unavailable")
    return CompileHealth(
        compiles=_count(data.get("compiles")),
        recompiles=_count(data.get("recompiles")),
        fallbacks=_count(data.get("fallbacks")),
        graph_breaks=_count(data.get("graph_breaks")),
        compile_s=_seconds(data.get("compile_s")),
        blocked_after_warmup_s=_seconds(data.get("blocked_after_warmup_s")),
        cudagraph_rerecords=_count(graphs.get("rerecords")) if isinstance(graphs, dict)
        else None,
        functions=tuple(functions),
        unavailable=tuple(t for t in (_text(u, 200) for u in unavailable[:8]) if t)
        if isinstance(unavailable, list) else (),
    )


def compile_lines(health: CompileHealth) -> list[str]:
    """The process view's lines: the totals, then each compiled function."""
    lines = [f"torch.compile: {health.compiles} compile(s), {health.recompiles} recompile(s), "
             f"{health.graph_breaks} graph break(s), {health.fallbacks} fallback(s) to eager; "
             f"{health.compile_s:.1f} s compiling ({health.blocked_after_warmup_s:.1f} s after "
             "warm-up)"
             + (f"; CUDA graphs re-recorded {health.cudagraph_rerecords} time(s)"
                if health.cudagraph_rerecords else "")]
    for f in health.functions[:6]:
        where = f"{os.path.basename(f.file or '?')}:{f.line}" if f.line else "?"
        lines.append(f"  {f.function} ({where}): {f.compiles} compile(s), "
                     f"{f.recompiles} recompile(s)" + ("; hit the limit, runs eager"
                                                       if f.fallback else ""))
    return lines
