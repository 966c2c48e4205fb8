"""torch.compile's health of a process, from its agent's ``compile`` status.

The agent's reply is untrusted: every figure is checked here, by the rule of every number from
an agent (``gputop.core.validate.number``: finite and in range, or refused; never clamped to a value
that is then shown), before it becomes a ``CompileHealth`` (``snapshot --json``'s
``compiled``, the process view's line). ``gputop.core.agent_status.check_compile`` is
that check where the reply is read, which names each refused field in ``rejected``; a health with a
refused total is not shown at all, a function with a refused figure is left out. The live
findings (``diagnostics/live/compile.py``) read the agent's events themselves.
"""

from __future__ import annotations

import os
from typing import Any

from gputop.core.agent_status import _FUNCTION, _TOTALS, COMPILES, AgentStatus, _refused
from gputop.core.format import safe_text
from gputop.core.model import CompiledFunction, CompileHealth
from gputop.core.validate import AGE, number

MAX_FUNCTIONS = 16


def _count(value: Any) -> int:
    return int(number(value, *COMPILES, integer=True) or 0)  # absent: none counted


def _seconds(value: Any) -> float:
    return round(float(number(value, *AGE) or 0.0), 3)


def _text(value: Any, limit: int) -> str | None:
    if not isinstance(value, str):
        return None
    # Escaped as every other untrusted string is shown (replay's ``\x1b``), not dropped.
    return safe_text(value[:limit])


def compile_health(agent: AgentStatus | None) -> CompileHealth | None:
    """The process's CompileHealth, or None when its agent reports no torch.compile."""
    data = agent.compile if agent is not None else None
    if not isinstance(data, dict):
        return None
    if _refused(data, _TOTALS) or any(data.get(key, 0) is None for key in _TOTALS):
        return None  # a total refused (here or where the reply was read): nothing shown
    functions = []
    raw = data.get("functions")
    for f in raw[:MAX_FUNCTIONS] if isinstance(raw, list) else []:
        if not isinstance(f, dict) or _refused(f, _FUNCTION) or \
                any(key in f and f[key] is None for key in ("compiles", "recompiles")):
            continue  # a function with a refused figure is left out, not shown as 0
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
    rerecords = number(graphs.get("rerecords"), *COMPILES, integer=True) \
        if isinstance(graphs, dict) else None  # refused: None, as unknown
    unavailable = data.get("unavailable")
    return CompileHealth(
        compiles=_count(data.get("compiles")),
        recompiles=_count(data.get("recompiles")),
        fallbacks=_count(data.get("fallbacks")),
        graph_breaks=_count(data.get("graph_breaks")),
        compile_s=_seconds(data.get("compile_s")),
        blocked_after_warmup_s=_seconds(data.get("blocked_after_warmup_s")),
        cudagraph_rerecords=None if rerecords is None else int(rerecords),
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
