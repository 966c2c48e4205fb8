"""Every rule over the windows, and one root cause per GPU.

Explanations of why a GPU does less work than it could. One GPU gets at most one at a time,
the most specific evidence first: no progress at all; threads that wait for a CPU (the kernel's
run-queue accounting: what that wait inflates is its effect); a measured or saturated input pipeline;
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

from gputop.core.job_groups import jobs_in
from gputop.core.model import Snapshot
from gputop.diagnostics.findings import Finding, order_findings
from gputop.diagnostics.live.compile import rule_compile
from gputop.diagnostics.live.cpu import rule_cpu_contention
from gputop.diagnostics.live.efficiency import rule_mfu_drop
from gputop.diagnostics.live.hang import rule_hang
from gputop.diagnostics.live.hardware import rule_hardware, rule_throttling
from gputop.diagnostics.live.host import rule_host_bound, rule_host_sync, rule_launch_bound
from gputop.diagnostics.live.idle import rule_gpu_idle, rule_hung
from gputop.diagnostics.live.input import rule_dataloader_stall
from gputop.diagnostics.live.memory import rule_memory
from gputop.diagnostics.live.pcie import rule_pcie
from gputop.diagnostics.live.ranks import annotate
from gputop.diagnostics.live.roofline import rule_roofline
from gputop.diagnostics.live.sharing import rule_contention, rule_imbalance, rule_rank_imbalance
from gputop.diagnostics.live.windows import _Windows

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
    rule_compile,
    rule_hang,
    rule_cpu_contention,
    rule_roofline,
)

# mfu-drop last: a job slower than its own best window, which any of the others explains better.
# latency-bound (idle SMs on a busy GPU) after the host's causes, which explain it when they hold.
ROOT_CAUSES = ("hung", "dataloader-stall", "pcie-bound", "throttling", "cpu-contention",
               "host-sync", "launch-bound", "host-bound", "latency-bound", "contention",
               "imbalance", "gpu-idle", "mfu-drop")
# Causes of one rank are ordered by their cost.
_HOST = ("host-sync", "launch-bound", "host-bound")
_RANK = {cause: ROOT_CAUSES.index(_HOST[0]) if cause in _HOST else i
         for i, cause in enumerate(ROOT_CAUSES)}
# What a wait for a CPU inflates (a starved input pipeline, the host's code, an idle GPU, a
# slower job): where cpu-contention holds, these follow from it and rank after it. A link or
# clocks that hold the GPU back do not come from the host's CPUs and keep their place.
INFLATED = frozenset({"dataloader-stall", "host-sync", "launch-bound", "host-bound", "gpu-idle",
                      "mfu-drop"})


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
        contended = any(f.id == "cpu-contention" for f in cands)
        cands.sort(key=lambda f: (_RANK[f.id] + (len(ROOT_CAUSES) if contended and f.id in INFLATED
                                                 else 0), -f.cost_s))
        win, others = cands[0], [c for c in cands[1:] if c.id != cands[0].id]
        effects = [c for c in others if c.id in INFLATED] if win.id == "cpu-contention" else []
        held = [c for c in others if c not in effects]
        if effects:  # in rank order: the first is what would be the cause without the wait
            names = "; ".join(f"{c.id} ({c.title})" for c in effects)
            win = replace(win, evidence=f"{win.evidence}. Its effects (inflated by the wait "
                                        f"for a CPU, not causes): {names}")
        if held:
            names = "; ".join(f"{c.id} ({c.title})" for c in held)
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
