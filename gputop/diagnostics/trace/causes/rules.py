"""Trace rules: turn ``TraceMetrics`` into ``Finding`` objects.

Every cause is costed by the device time it explains (``gaps``: each idle instant has one
cause), never by how long the host waited, and its severity comes from that cost's share of the
judged window (``findings.severity_for``). Thresholds come from how the hardware and runtime work
and from the published rules of the tools users compare against (TensorBoard profiler plugin,
Holistic Trace Analysis, Nsight Systems expert rules); each carries its reason next to it.

One module per family of causes in ``causes/`` (mirroring ``diagnostics/live/``): ``input``,
``host``, ``idle``, ``pcie``, ``memory``, ``sharing``, ``compute``; ``common`` holds their
thresholds and phrasing. Here: every rule in order, the busy floor and the healthy summary.
"""

from __future__ import annotations

from collections.abc import Callable

from gputop.core.format import ms_h
from gputop.diagnostics import next_steps as ns
from gputop.diagnostics.findings import (
    SEVERITY_RANK,
    Finding,
    order_findings,
)
from gputop.diagnostics.trace.causes.common import (
    HEALTHY_BUSY_FLOOR_PCT,
    busy_pct,
    device_word,
    named_labels,
    of_what,
    percent,
    share_of,
    training_app,
    vendor_profile,
    window_phrase,
)
from gputop.diagnostics.trace.causes.compute import no_tensor_cores
from gputop.diagnostics.trace.causes.host import cold_start, host_sync, launch_bound
from gputop.diagnostics.trace.causes.idle import gpu_idle, long_gpu_gaps, queued_work
from gputop.diagnostics.trace.causes.input import dataloader_stall, host_dataloader
from gputop.diagnostics.trace.causes.memory import allocator_churn, memory_pressure
from gputop.diagnostics.trace.causes.pcie import copy_bound, pageable_memcpy
from gputop.diagnostics.trace.causes.sharing import communication
from gputop.diagnostics.trace.measuring.metrics import TraceMetrics

RULES: tuple[Callable[[TraceMetrics], list[Finding]], ...] = (
    dataloader_stall,
    host_sync,
    launch_bound,
    communication,
    allocator_churn,
    cold_start,
    long_gpu_gaps,
    gpu_idle,
    no_tensor_cores,
    memory_pressure,
    pageable_memcpy,
    copy_bound,
)
# The finding that names each idle cause when the busy floor asks for one.
_CAUSE_RULE: dict[str, Callable[[TraceMetrics], list[Finding]]] = {
    "dataloader": dataloader_stall,
    "sync": host_sync,
    "launch": launch_bound,
    "allocator": allocator_churn,
    "startup": cold_start,
    "host": gpu_idle,
    "unprofiled": gpu_idle,
    "queued": gpu_idle,
    "unrecorded": gpu_idle,
    "copy": pageable_memcpy,
    "communication": communication,
}
# GPU activity not recorded: only what the host shows (and the allocator's own events).
HOST_RULES: tuple[Callable[[TraceMetrics], list[Finding]], ...] = (host_dataloader,
                                                                    memory_pressure)


def run_rules(m: TraceMetrics) -> list[Finding]:
    if m.gpu_unrecorded:
        return order_findings(f for rule in HOST_RULES for f in rule(m))
    findings: list[Finding] = []
    for rule in RULES:
        findings.extend(rule(m))
    findings = _busy_floor(m, findings)
    return order_findings(findings)


def _busy_floor(m: TraceMetrics, findings: list[Finding]) -> list[Finding]:
    """Below the busy floor the verdict may not be healthy: the biggest idle cause is named at
    warning even when it is under 5% on its own."""
    if any(SEVERITY_RANK[f.severity] >= SEVERITY_RANK["warning"] for f in findings):
        return findings
    if m.step_total_ms <= 0 or busy_pct(m) >= HEALTHY_BUSY_FLOOR_PCT:
        return findings
    causes = {c: ms for c, ms in m.roles_ms.items() if c in _CAUSE_RULE and ms > 0}
    if "communication" in causes:
        causes["communication"] = m.roles_ms.get("communication", 0.0)
    if not causes:
        return findings
    biggest = max(causes, key=causes.get)
    cost = causes[biggest]
    if biggest in ("host", "unprofiled", "queued"):
        cost = sum(causes.get(c, 0.0) for c in ("host", "unprofiled", "queued"))
    why = (
        f" (the {device_word(m)} is busy only {busy_pct(m):.0f}% of the {of_what(m)}, under the "
        f"{HEALTHY_BUSY_FLOOR_PCT:.0f}% floor for a healthy verdict; this is the biggest single "
        "cause)"
    )
    out = [f for f in findings]
    existing = [f for f in out if f.id == _rule_id(biggest)]
    if existing:
        f = existing[0]
        out.remove(f)
        out.append(_promote(f, why))
        return out
    out.append(_floor_finding(m, biggest, cost, why))
    return out


def _rule_id(cause: str) -> str:
    return {
        "dataloader": "dataloader-stall", "sync": "host-sync", "launch": "launch-bound",
        "allocator": "allocator-churn", "startup": "cold-start", "copy": "pageable-memcpy",
        "communication": "communication",
    }.get(cause, "gpu-idle")


def _promote(f: Finding, why: str) -> Finding:
    return Finding(id=f.id, severity="warning", title=f.title, evidence=f.evidence + why,
                   fix=f.fix, next_step=f.next_step, cost_s=f.cost_s, gpu=f.gpu, pid=f.pid)


def _floor_finding(m: TraceMetrics, cause: str, cost_ms: float, why: str) -> Finding:
    share = share_of(m, cost_ms)
    if cause == "queued":
        f = queued_work(m, floor=True)
        title, evidence, fix, next_step, fid = f.title, f.evidence, f.fix, f.next_step, f.id
    else:
        labels = named_labels(m, cause) or cause
        title = f"The {device_word(m)} idles {percent(share)} of the {of_what(m)} in {cause}"
        evidence = f"{ms_h(cost_ms)} {window_phrase(m)}: {labels}"
        fid = _rule_id(cause)
        fix = "See the cause above."
        next_step = vendor_profile(m, "idle", ns.nsys("idle", app=training_app(m)))
        template = _CAUSE_RULE[cause]
        fix = _template_fix(template, fix)
    return Finding(id=fid, severity="warning", title=title, evidence=evidence + why, fix=fix,
                   next_step=next_step, cost_s=cost_ms / 1e3)


_FIXES = {
    "dataloader_stall": "Raise num_workers, set pin_memory=True and persistent_workers=True, "
    "make each sample cheaper.",
    "host_sync": "Drop .item()/.cpu()/synchronize() from the step; read metrics every N steps.",
    "launch_bound": "Fewer, bigger kernels: torch.compile, CUDA graphs, a larger batch, fused "
    "optimizers.",
    "allocator_churn": "No empty_cache() in the loop, static shapes, "
    "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True.",
    "cold_start": "Profile after warm-up: torch.profiler.schedule(wait=1, warmup=2, active=3).",
    "gpu_idle": "Take host work (logging, metrics, I/O, preprocessing) off the step or overlap "
    "it.",
    "pageable_memcpy": "pin_memory=True and .to(device, non_blocking=True).",
    "communication": "Overlap communication with compute (DDP buckets, FSDP prefetch).",
}


def _template_fix(rule, default: str) -> str:
    return _FIXES.get(rule.__name__, default)


def healthy_summary(m: TraceMetrics) -> str:
    busy = busy_pct(m)
    idle = [
        (cause, m.roles_ms.get(cause, 0.0))
        for cause in ("launch", "sync", "dataloader", "host", "unprofiled", "allocator",
                      "startup", "copy", "queued", "unrecorded")
        if m.roles_ms.get(cause, 0.0) > 0
    ]
    idle.sort(key=lambda kv: -kv[1])
    rest = ", ".join(f"{cause} {100 * share_of(m, ms):.1f}%" for cause, ms in idle[:4])
    device = "GPU" if m.gpu_present else "CPU compute"
    head = f"{device} busy {busy:.0f}% of the {of_what(m)} {window_phrase(m)}"
    if rest:
        return f"{head}; the idle rest ({rest}) has no cause at 5% or more"
    return head
