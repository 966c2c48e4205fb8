"""torch.compile's health: ``recompiles``, ``graph-breaks``, ``compile-fallback``,
``compile-stall`` and ``cudagraph-rerecord``.

From the agent's ``compile`` status (``gputop/agent/compile_watch.py``: what dynamo keeps in
the process): each recompile with the guard that failed, each graph break with its reason and
user line, the functions the recompile limit sent back to eager, the seconds steps were
blocked compiling after warm-up, CUDA-graph re-recordings. The agent's reply is untrusted
input: every field is checked and bounded here; a malformed one is ignored.

Thresholds: any recompile in the last ``RECENT_S`` is worth naming (a fixed-shape job never
recompiles after its first steps: each one blocks the step for the whole compile); the
functions' own recompile limit makes it critical at half the limit. A graph break is a
permanent property of the compiled code (every call returns to Python there), raised once the
job has taken a step past it. A stall needs ``STALL_S`` of blocked steps in ``RECENT_S``.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from gputop.diagnostics import next_steps as ns
from gputop.diagnostics.findings import Finding

if TYPE_CHECKING:
    from gputop.core.model import ProcSample
    from gputop.diagnostics.live.windows import _Context

RECENT_S = 300.0  # recompiles, stalls and re-recordings counted over the last 5 minutes
STALL_S = 2.0  # seconds of steps blocked on compilation after warm-up (warning)
STALL_CRITICAL_S = 30.0
MAX_ITEMS = 64  # list entries read from one reply


def _procs(ctx: _Context) -> list[tuple[int | None, ProcSample, dict[str, Any]]]:
    snap = ctx.window[-1]
    seen: set[int] = set()
    out: list[tuple[int | None, ProcSample, dict[str, Any]]] = []
    placed: list[tuple[int | None, ProcSample]] = [
        (g.index, p) for g in snap.gpus for p in g.processes]
    placed += [(None, p) for p in snap.other_processes]
    for gpu, p in placed:
        data = p.agent.compile if p.agent is not None else None
        if p.pid not in seen and isinstance(data, dict):
            seen.add(p.pid)
            out.append((gpu, p, data))
    return out


# -- reading the untrusted reply ----------------------------------------------------------------

def _num(value: Any, default: float = 0.0) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
        return default
    return float(min(max(value, -1e18), 1e18))


def _int(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value if 0 <= value < 2**31 else None


def _str(value: Any, limit: int = 200) -> str:
    if not isinstance(value, str):
        return ""
    return "".join(c if c.isprintable() else " " for c in value[:limit])


def _items(data: dict[str, Any], key: str) -> list[dict[str, Any]]:
    value = data.get(key)
    if not isinstance(value, list):
        return []
    return [v for v in value[:MAX_ITEMS] if isinstance(v, dict)]


def _place(entry: dict[str, Any]) -> str:
    """"train.py:41" from a file and line (the file's name: the evidence stays one line)."""
    file = os.path.basename(_str(entry.get("file"), 300)) or "?"
    line = _int(entry.get("line"))
    return f"{file}:{line}" if line is not None else file


def _function(entry: dict[str, Any]) -> str:
    return _str(entry.get("function"), 120) or "?"


def _root(name: str) -> str:
    """A resume function ("forward (after line 14)") belongs to its function."""
    return name.split(" (after line", 1)[0]


# -- the rules --------------------------------------------------------------------------------

def rule_compile(ctx: _Context) -> list[Finding]:
    out: list[Finding] = []
    for gpu, proc, data in _procs(ctx):
        out += _recompiles(ctx, gpu, proc.pid, data)
        out += _fallbacks(gpu, proc.pid, data)
        out += _graph_breaks(gpu, proc.pid, data)
        out += _stall(ctx, gpu, proc.pid, data)
        out += _rerecord(ctx, gpu, proc.pid, data)
    return out


def _recompiles(ctx: _Context, gpu: int | None, pid: int, data: dict[str, Any]) -> list[Finding]:
    # Per user function: a recompile of a function also recompiles the resume functions after
    # its graph breaks, so its count is the most of any of its frames.
    groups: dict[tuple[str, str], dict[str, Any]] = {}
    for e in _items(data, "events"):
        if e.get("kind") != "recompile" or _num(e.get("t")) < ctx.now - RECENT_S:
            continue
        name = _function(e)
        key = (_str(e.get("file"), 300), _root(name))
        group = groups.setdefault(key, {"frames": {}, "last": None, "entry": None})
        frame = _str(e.get("frame"), 12)
        group["frames"][frame] = group["frames"].get(frame, 0) + 1
        entry = group["entry"]
        if entry is None or (name == _root(name) and _function(entry) != name):
            group["entry"] = e  # its first, the function itself over its resume functions
        if _num(e.get("t")) >= _num((group["last"] or {}).get("t"), -1):
            group["last"] = e
    if not groups:
        return []
    # One finding per process (a finding is keyed by id and pid): the function that
    # recompiled most, the others named after it.
    ranked = sorted(groups.items(), key=lambda kv: -max(kv[1]["frames"].values()))
    (_, name), group = ranked[0]
    count = max(group["frames"].values())
    entry, last = group["entry"], group["last"]
    change = _str(last.get("change")) or _str(last.get("reason")) or "a guard failed"
    first_change = _str(entry.get("change"))
    if first_change and first_change != change:
        change = f"{first_change}; last: {change}"
    others = "".join(f"; also `{n}` ({_place(g['entry'])}) {max(g['frames'].values())} time(s)"
                     for (_, n), g in ranked[1:4])
    limit = _int(data.get("recompile_limit"))
    critical = limit is not None and limit > 0 and count >= max(2, limit // 2)
    return [Finding(
        id="recompiles",
        severity="critical" if critical else "warning",
        title=f"pid {pid}: `{name}` recompiled {count} time(s) ({_place(entry)})",
        evidence=(f"{_place(entry)} `{name}` recompiled {count} time(s) in the last "
                  f"{RECENT_S / 60:.0f} minutes: {change}"
                  + (f" (recompile limit {limit})" if limit is not None else "")
                  + f"; each recompile blocks the step for a whole compile{others}"),
        fix=_recompile_fix(change),
        next_step=ns.gputop_capture(pid),
        cost_s=_blocked(ctx, data, late_only=True),
        gpu=gpu,
        pid=pid,
    )]


def _recompile_fix(change: str) -> str:
    if "size of" in change or "dim" in change:
        return ("Keep the shapes fixed or mark them dynamic: DataLoader(drop_last=True) for the "
                "last batch, pad variable lengths to a few bucket sizes, "
                "torch._dynamo.mark_dynamic(x, 0) before the call, or torch.compile(..., "
                "dynamic=True)")
    if "dtype" in change or "device" in change or "requires_grad" in change:
        return ("Call the compiled function with the same dtype/device/requires_grad every "
                "time (cast inputs once, outside the loop), or compile one function per variant")
    if "==" in change:
        return ("A Python value the code depends on changes between calls (a float from "
                ".item(), a counter, a flag): pass it as a tensor, or move it out of the "
                "compiled function")
    return ("Find what changes between calls with TORCH_LOGS=recompiles and make it constant, "
            "or mark it dynamic (torch._dynamo.mark_dynamic, dynamic=True)")


def _fallbacks(gpu: int | None, pid: int, data: dict[str, Any]) -> list[Finding]:
    limit = _int(data.get("recompile_limit"))
    events = [e for e in _items(data, "events") if e.get("kind") == "fallback"]
    fallen = [f for f in _items(data, "functions")
              if f.get("fallback") is True and " (after line" not in _function(f)]
    if not fallen:
        return []
    f = fallen[0]
    name = _function(f)
    change = next((_str(e.get("change")) for e in reversed(events)
                   if _root(_function(e)) == name), "") or _str(f.get("last_change"))
    others = "".join(f"; also `{_function(o)}` ({_place(o)})" for o in fallen[1:4])
    return [Finding(
        id="compile-fallback",
        severity="critical",
        title=f"pid {pid}: `{name}` hit the recompile limit and runs eager ({_place(f)})",
        evidence=(f"{_place(f)} `{name}` was compiled {_int(f.get('compiles')) or 0} "
                  f"time(s) and reached torch._dynamo.config.recompile_limit"
                  + (f" ({limit})" if limit is not None else "")
                  + (f"; the last change: {change}" if change else "")
                  + f": new inputs now run it uncompiled (eager){others}"),
        fix=("Remove the cause of the recompiles (see the recompiles finding: drop_last=True, "
             "bucket padding, mark_dynamic, dynamic=True); raise "
             "torch._dynamo.config.recompile_limit only if the variants are few and needed"),
        next_step=ns.gputop_capture(pid),
        gpu=gpu,
        pid=pid,
    )]


# Known graph-break reasons -> (what the user did, the rewrite).
_BREAK_FIXES = (
    (("Tensor.item()", ".item()"), "call to `Tensor.item()`",
     "keep the value a tensor inside forward (log it outside), or set "
     "torch._dynamo.config.capture_scalar_outputs = True"),
    (("generic_jump", "Data-dependent branching", "data-dependent"), "Python `if` on a tensor",
     "make it branchless (torch.where, torch.clamp) or use torch.cond"),
    (("print", "builtin: print"), "print()",
     "print outside the compiled function, or list the logger in "
     "torch._dynamo.config.reorderable_logging_functions"),
    (("Tensor.tolist", "tolist", "numpy", "Tensor.numpy"), "a tensor converted to Python/NumPy",
     "keep tensors as tensors inside forward"),
    (("dynamic shape operator", "nonzero", "Dynamic shape operator"),
     "an operator with a data-dependent output shape",
     "set torch._dynamo.config.capture_dynamic_output_shape_ops = True, or give it a fixed "
     "size (torch.nonzero_static)"),
)


def _explain_break(reason: str, code: str) -> tuple[str, str]:
    for needles, what, fix in _BREAK_FIXES:
        if any(n in reason or n in code for n in needles):
            return what, fix
    return (reason or "an unsupported construct",
            "see TORCH_LOGS=graph_breaks or torch._dynamo.explain(model)(inputs) for the "
            "construct, and rewrite or move it out of the compiled function")


def _graph_breaks(gpu: int | None, pid: int, data: dict[str, Any]) -> list[Finding]:
    breaks = _items(data, "breaks")[:12]
    if not breaks:
        return []
    parts: list[str] = []
    fixes: dict[str, str] = {}
    for b in breaks:
        what, fix = _explain_break(_str(b.get("reason")), _str(b.get("code"), 160))
        code = _str(b.get("code"), 80)
        parts.append(f"{what} at {_place(b)} in `{_function(b)}`" + (f" (`{code}`)" if code else ""))
        fixes.setdefault(what, fix)
    n = len(breaks)
    return [Finding(
        id="graph-breaks",
        severity="warning",
        title=f"pid {pid}: {n} graph break(s) in compiled code ({parts[0].split(' in `')[0]})",
        evidence=(f"{n} graph break(s), each taken on every call (a return to Python and a "
                  f"graph boundary per step): " + "; ".join(parts)),
        fix="; ".join(f"{what}: {fix}" for what, fix in fixes.items()),
        next_step=ns.gputop_capture(pid),
        gpu=gpu,
        pid=pid,
    )]


def _blocked(ctx: _Context, data: dict[str, Any], late_only: bool) -> float:
    total = 0.0
    blocked = data.get("blocked")
    for row in blocked[:256] if isinstance(blocked, list) else []:
        if not isinstance(row, list) or len(row) < 4:
            continue
        t, seconds, late = _num(row[0]), _num(row[1]), row[3] is True
        if t >= ctx.now - RECENT_S and 0 <= seconds < 86400 and (late or not late_only):
            total += seconds
    return total


def _stall(ctx: _Context, gpu: int | None, pid: int, data: dict[str, Any]) -> list[Finding]:
    blocked = _blocked(ctx, data, late_only=True)
    if blocked < STALL_S:
        return []
    return [Finding(
        id="compile-stall",
        severity="critical" if blocked >= STALL_CRITICAL_S else "warning",
        title=f"pid {pid}: steps blocked {blocked:.1f} s on compilation after warm-up",
        evidence=(f"the training thread waited {blocked:.1f} s in torch.compile in the last "
                  f"{RECENT_S / 60:.0f} minutes after its warm-up ({_int(data.get('recompiles')) or 0} "
                  f"recompile(s) so far; {_num(data.get('compile_s')):.1f} s compiling in all)"),
        fix=("Stop the recompiles (fixed or dynamic shapes) and compile every function during "
             "warm-up; for long compiles, mode='max-autotune' only where it pays, and the "
             "caches (TORCHINDUCTOR_FX_GRAPH_CACHE=1, mega-cache) across runs"),
        next_step=ns.gputop_capture(pid),
        cost_s=blocked,
        gpu=gpu,
        pid=pid,
    )]


def _rerecord(ctx: _Context, gpu: int | None, pid: int, data: dict[str, Any]) -> list[Finding]:
    graphs = data.get("cudagraph")
    if not isinstance(graphs, dict):
        return []
    times = graphs.get("rerecord_times")
    recent = [t for t in (times[:MAX_ITEMS] if isinstance(times, list) else [])
              if _num(t) >= ctx.now - RECENT_S]
    skips = _int(graphs.get("skips")) or 0
    if not recent and not skips:
        return []
    return [Finding(
        id="cudagraph-rerecord",
        severity="warning",
        title=f"pid {pid}: CUDA graphs re-recorded {len(recent)} time(s)",
        evidence=(f"inductor's cudagraph trees recorded a graph again {len(recent)} time(s) in "
                  f"the last {RECENT_S / 60:.0f} minutes ({_int(graphs.get('recordings')) or 0} "
                  f"recordings in all; each stops the step to capture)"
                  + (f"; {skips} function(s) skipped CUDA graphs (run without them)"
                     if skips else "")),
        fix=("Keep the inputs of the compiled function the same shape (pad to buckets, "
             "drop_last=True) and their addresses stable (no new static inputs each step); "
             "mode='max-autotune-no-cudagraphs' where shapes must vary"),
        next_step=ns.gputop_capture(pid),
        gpu=gpu,
        pid=pid,
    )]
