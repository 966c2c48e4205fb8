"""GPU memory: ``memory-pressure`` and ``memory-growth``.

Pressure: over 90 % of the board's memory in use for a window (97 %: critical). Growth: a
least-squares line through up to five minutes of memory readings (since the job's start-up:
the caching allocator's first fill is not a leak) that rises steadily (R^2 >= 0.9) by at least
1 % of the board; critical when it has held a minute and reaches the board's size within ten.
"""

from __future__ import annotations

from gputop.core.model import GpuSample
from gputop.diagnostics import next_steps as ns
from gputop.diagnostics.findings import Finding
from gputop.diagnostics.live.common import (
    MEMORY_CRITICAL_S,
    MEMORY_MIN_S,
    MEMORY_WINDOW_S,
    WINDOW_S,
    duration,
    gib,
    mean,
)
from gputop.diagnostics.live.windows import _Context


def rule_memory(ctx: _Context) -> list[Finding]:
    out = []
    for index, gpus in ctx.per_gpu():
        last = gpus[-1]
        if not last.mem_total or last.mem_used is None:
            continue
        share = mean(g.mem_used / g.mem_total for g in gpus if g.mem_used is not None)
        if share is not None and share > 0.9:
            out.append(Finding(
                id="memory-pressure",
                severity="critical" if share > 0.97 else "warning",
                title=f"GPU {index} memory nearly full",
                evidence=f"{share * 100:.1f}% of {gib(last.mem_total)} in use over {WINDOW_S:.0f} s",
                fix=("Lower the batch size or use gradient accumulation, activation checkpointing, "
                     "mixed precision; set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True "
                     "against fragmentation. `m` on the process in the monitor (or the next "
                     "step) shows what the step's peak is made of and what is reserved"),
                next_step=_memory_next_step(gpus, index),
                gpu=index,
            ))
    for index, gpus in ctx.per_gpu():
        fit = ctx.gpus[index].memory
        n = len(fit)
        if n < 8:
            continue
        # Each sample stands for its interval: n samples cover n intervals, not n - 1.
        covered = (fit.times[-1] - fit.times[0]) * n / (n - 1)
        if covered < MEMORY_MIN_S:
            continue
        ts, ys = (fit.times[0], fit.times[-1]), (fit.values[0], fit.values[-1])
        slope, r2 = fit.fit()
        total = gpus[-1].mem_total or 0
        rise = ys[-1] - ys[0]
        if slope <= 0 or r2 < 0.9 or not total or rise < 0.01 * total:
            continue
        to_oom = (total - ys[-1]) / slope
        span = ts[-1] - ts[0]
        # Critical only for a rise that has lasted a minute: the caching allocator's first fill
        # also rises steadily for some seconds.
        critical = to_oom < 600 and span >= MEMORY_CRITICAL_S
        full = "" if span >= MEMORY_WINDOW_S - 1 else (
            f" (all {span:.0f} s of history so far; the fit uses up to "
            f"{MEMORY_WINDOW_S / 60:.0f} min)")
        out.append(Finding(
            id="memory-growth",
            severity="critical" if critical else "warning",
            title=f"GPU {index} memory rising steadily",
            evidence=(f"+{gib(rise)} in {span:.0f} s{full} ({slope / 1024**2:.0f} MiB/s, "
                      f"R²={r2:.2f}); at this rate out of memory in {duration(to_oom)}"),
            fix=("A leak: tensors kept across steps (losses appended without .item() or "
                 ".detach(), a growing cache, retain_graph=True). Keep scalars, not graphs. "
                 "`m` on the process in the monitor (or the next step) names the source line "
                 "whose allocations grow and what keeps them"),
            next_step=_memory_next_step(gpus, index),
            cost_s=span if critical else 0.0,
            gpu=index,
        ))
    return out


def _memory_next_step(gpus: list[GpuSample], index: int) -> str:
    """A memory capture of the process holding the most memory (through its agent: `m` in the
    monitor), else list who holds what."""
    procs = [p for p in gpus[-1].processes if p.visible]
    if procs:
        top = max(procs, key=lambda p: p.gpu_mem or 0)
        if top.agent:
            return ns.gputop_memory(top.pid)
    return f"nvidia-smi --query-compute-apps=pid,used_memory --format=csv -i {index}"
