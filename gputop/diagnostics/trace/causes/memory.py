"""Device memory in a trace: allocator churn and memory pressure.
"""

from __future__ import annotations

from gputop.core.format import ms_h
from gputop.diagnostics import next_steps as ns
from gputop.diagnostics.findings import (
    WARNING_SHARE,
    Finding,
    severity_for,
)
from gputop.diagnostics.trace.causes.common import (
    MEMORY_PRESSURE_PCT,
    device_word,
    of_what,
    percent,
    share_of,
    training_app,
    vendor_profile,
    window_phrase,
)
from gputop.diagnostics.trace.measuring.metrics import TraceMetrics


def allocator_churn(m: TraceMetrics) -> list[Finding]:
    a = m.values["allocator"]
    if a["warmup_only"]:
        return []  # the cache warming up in the first step: cold-start's
    cost = a["idle_cost_ms"]
    share = share_of(m, cost)
    if share < WARNING_SHARE:
        return []
    return [
        Finding(
            id="allocator-churn",
            severity=severity_for(share),
            title=f"The {device_word(m)} waits on cudaMalloc/cudaFree {percent(share)} of the "
            f"{of_what(m)}",
            evidence=(
                f"{a['malloc_calls']} allocation and {a['free_calls']} free calls take "
                f"{ms_h(a['time_ms'])} {window_phrase(m)}, {ms_h(cost)} of it with the device "
                "idle; the caching allocator keeps going back to the driver (cudaFree also "
                "synchronises the device)."
            ),
            fix=(
                "Let the caching allocator reuse memory: no torch.cuda.empty_cache() in the "
                "loop, static shapes (pad or bucket variable lengths), "
                "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True against fragmentation, and "
                "reuse preallocated buffers; if this is start-up, profile after warm-up with "
                "torch.profiler.schedule(wait=1, warmup=2, active=3)."
            ),
            next_step=vendor_profile(m, "alloc", ns.nsys(
                "alloc", app=training_app(m), trace="cuda,osrt", extra=("--cuda-memory-usage=true",))),
            cost_s=cost / 1e3,
        )
    ]


def memory_pressure(m: TraceMetrics) -> list[Finding]:
    mem = m.values.get("memory", {})
    out = []
    for dev, pct in (mem.get("peak_pct_of_capacity") or {}).items():
        if pct < MEMORY_PRESSURE_PCT:
            continue
        peak = mem["peak_allocated_bytes"][dev] / 2**30
        cap = mem["capacity_bytes"][dev] / 2**30
        out.append(
            Finding(
                id="memory-pressure",
                severity="warning",
                title=f"GPU {dev} memory at {pct:.0f}% of capacity",
                evidence=f"peak allocated {peak:.1f} GiB of {cap:.1f} GiB during the trace.",
                fix=(
                    "Make room before it fails or fragments: activation checkpointing "
                    "(torch.utils.checkpoint), mixed precision, a smaller micro-batch with "
                    "gradient accumulation, PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True."
                ),
                next_step=vendor_profile(m, "memory", ns.nsys(
                    "memory", app=training_app(m), trace="cuda", extra=("--cuda-memory-usage=true",))),
                cost_s=0.0,
                gpu=int(dev) if dev.isdigit() else None,
            )
        )
    return out
