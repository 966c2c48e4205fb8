"""Every rule over the windows, and one root cause per GPU.

Explanations of why a GPU does less work than it could. One GPU gets at most one at a time,
the most specific evidence first: no progress at all; a measured or saturated input pipeline;
a saturated link; lowered clocks; the host (its waits on the device, kernels too small to fill
the SMs, its own code: these three explain the same idle time from one thread, so the one
that costs the most wins: a per-step ``.item()`` that waits 5 % of a step does not explain a
GPU idle 78 % behind a host busy with its Python); a shared GPU; an uneven job; and last, idle
with nothing else to blame. The others that held are named in the winner's evidence, not
reported beside it. memory-pressure, memory-growth and hardware-errors are conditions, not explanations of the
same symptom, and are reported on their own.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from gputop.diagnostics.findings import Finding, order_findings
from gputop.diagnostics.live.efficiency import rule_mfu_drop
from gputop.diagnostics.live.hardware import rule_hardware, rule_throttling
from gputop.diagnostics.live.host import rule_host_bound, rule_host_sync, rule_launch_bound
from gputop.diagnostics.live.idle import rule_gpu_idle, rule_hung
from gputop.diagnostics.live.input import rule_dataloader_stall
from gputop.diagnostics.live.memory import rule_memory
from gputop.diagnostics.live.pcie import rule_pcie
from gputop.diagnostics.live.ranks import annotate
from gputop.diagnostics.live.sharing import rule_contention, rule_imbalance, rule_rank_imbalance
from gputop.diagnostics.live.windows import _Windows
from gputop.job_groups import jobs_in
from gputop.model import Snapshot

RULES = (
    rule_dataloader_stall,
    rule_host_sync,
    rule_host_bound,
    rule_gpu_idle,
    rule_hung,
    rule_throttling,
    rule_memory,
    rule_pcie,
    rule_contention,
    rule_imbalance,
    rule_rank_imbalance,
    rule_hardware,
    rule_launch_bound,
    rule_mfu_drop,
)

# mfu-drop last: a job slower than its own best window, which any of the others explains better.
ROOT_CAUSES = ("hung", "dataloader-stall", "pcie-bound", "throttling", "host-sync",
               "launch-bound", "host-bound", "contention", "imbalance", "gpu-idle", "mfu-drop")
# Causes of one rank are ordered by their cost.
_HOST = ("host-sync", "launch-bound", "host-bound")
_RANK = {cause: ROOT_CAUSES.index(_HOST[0]) if cause in _HOST else i
         for i, cause in enumerate(ROOT_CAUSES)}


def _group(f: Finding) -> object:
    # A job's straggler is the job's root cause, beside whatever holds its GPU.
    if f.id == "imbalance" and f.job is not None:
        return ("job", f.job)
    return f.gpu if f.gpu is not None else ("pid", f.pid)


def arbitrate(found: Iterable[Finding]) -> list[Finding]:
    """One root cause per GPU (see ``ROOT_CAUSES``); the losing candidates become evidence."""
    out: list[Finding] = []
    groups: dict[object, list[Finding]] = {}
    for f in found:
        if f.id in ROOT_CAUSES:
            groups.setdefault(_group(f), []).append(f)
        else:
            out.append(f)
    for cands in groups.values():
        cands.sort(key=lambda f: (_RANK[f.id], -f.cost_s))
        win, others = cands[0], [c for c in cands[1:] if c.id != cands[0].id]
        if others:
            names = "; ".join(f"{c.id} ({c.title})" for c in others)
            win = replace(win, evidence=f"{win.evidence}. Also held, explained by this: {names}")
        out.append(win)
    return out


def evaluate(history: list[Snapshot], own_pid: int | None = None) -> list[Finding]:
    """Every finding whose condition holds at the newest snapshot (no hysteresis)."""
    windows = _Windows()
    for snap in history:
        windows.add(snap)
    return evaluate_windows(windows, own_pid)


def evaluate_windows(windows: _Windows, own_pid: int | None) -> list[Finding]:
    ctx = windows.context(own_pid)
    if ctx is None:
        return []
    found: list[Finding] = []
    for rule in RULES:
        found.extend(rule(ctx))
    jobs = jobs_in(ctx.window[-1])
    if any(f.id == "imbalance" and f.job is not None for f in found):
        # The agents' step times name the straggler; GPU utilisation only guesses at it.
        found = [f for f in found if f.id != "imbalance" or f.job is not None]
    return order_findings(arbitrate(annotate(found, jobs)))
