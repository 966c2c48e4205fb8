"""The device waits on the host in a trace: ``host-sync``, ``launch-bound``, ``cold-start``.
"""

from __future__ import annotations

from gputop.core.format import ms_h
from gputop.diagnostics import next_steps as ns
from gputop.diagnostics.findings import (
    CRITICAL_SHARE,
    SEVERITY_RANK,
    WARNING_SHARE,
    Finding,
    severity_for,
)
from gputop.diagnostics.trace.causes.common import (
    D2H_READ_BLOCKED_SHARE,
    HEALTHY_BUSY_FLOOR_PCT,
    INFO_SHARE,
    capture_or_run,
    cost_of,
    device_word,
    named_labels,
    of_what,
    percent,
    share_of,
    training_app,
    useful_busy_pct,
    vendor_profile,
    window_phrase,
)
from gputop.diagnostics.trace.measuring.metrics import TraceMetrics


def host_sync(m: TraceMetrics) -> list[Finding]:
    s = m.values["sync"]
    cost = cost_of(m, "sync")
    share = share_of(m, cost)
    reads = s.get("d2h_read_blocked_pct", 0.0) / 100
    severity = severity_for(share)
    if reads >= D2H_READ_BLOCKED_SHARE and SEVERITY_RANK[severity] < SEVERITY_RANK["warning"]:
        severity = "warning"
    elif share < INFO_SHARE:
        return []
    calls = ", ".join(f"{n} {name}" for name, n in s["calls"].items())
    item = f"{s['item_calls']} aten::item ({ms_h(s['item_ms'])}); " if s["item_calls"] else ""
    named = named_labels(m, "sync")
    busy = s["waited_on_busy_device_ms"]
    busy_txt = (
        f"; the other {ms_h(busy)} of waiting overlapped {device_word(m)} work and costs nothing "
        "(a host waiting on a busy device is the healthy, device-bound pattern)"
        if busy > 0.05 * max(cost, 1e-9)
        else ""
    )
    if reads >= D2H_READ_BLOCKED_SHARE and share < WARNING_SHARE:
        title = (
            f"Device-to-host reads block the host {percent(reads)} of the {of_what(m)}: it "
            "cannot run ahead of the GPU"
        )
        busy_txt += (
            f"; the reads (.item(), .cpu(), .tolist()) held the training thread "
            f"{ms_h(s['d2h_read_blocked_ms'])}, during which it queued nothing: the GPU "
            "stayed busy only on work queued before, so any slower host path now shows as "
            "GPU idle"
        )
    else:
        title = (
            f"The {device_word(m)} sits idle {percent(share)} of the {of_what(m)} while the host "
            "waits on it"
        )
    return [
        Finding(
            id="host-sync",
            severity=severity,
            title=title,
            evidence=(
                f"{ms_h(cost)} {window_phrase(m)} with nothing running on the {device_word(m)} while "
                f"the launching thread was blocked in {named or 'synchronising calls'} "
                f"({item}{calls or 'synchronising calls'}){busy_txt}."
            ),
            fix=(
                "Keep values on the GPU: drop .item(), .cpu(), .tolist() and print(loss) from "
                "the step (accumulate metrics in tensors, read them every N steps); remove "
                "torch.cuda.synchronize() from the loop; use non_blocking=True copies into pinned "
                "memory; avoid Python branches on tensor values. "
                "torch.cuda.set_sync_debug_mode('warn') points at each sync."
            ),
            next_step=vendor_profile(m, "sync", ns.nsys_sync(training_app(m))),
            cost_s=cost / 1e3,
        )
    ]


def launch_bound(m: TraceMetrics) -> list[Finding]:
    cost = cost_of(m, "launch")
    share = share_of(m, cost)
    if share < WARNING_SHARE:
        return []
    useful = useful_busy_pct(m)
    severity = severity_for(share)
    if useful >= HEALTHY_BUSY_FLOOR_PCT and share < CRITICAL_SHARE:
        severity = "info"
    k = m.values["kernels"]
    host_pk, gpu_pk = k.get("host_us_per_launch", 0.0), k.get("gpu_us_per_kernel", 0.0)
    named = named_labels(m, "launch")
    if m.gpu_present and host_pk and gpu_pk:
        detail = (
            f"the host spends {host_pk:.0f} us per launched kernel in the launch path against "
            f"{gpu_pk:.1f} us of GPU time per kernel"
        )
        if severity != "info":
            detail += (": it cannot keep the GPU fed" if host_pk >= gpu_pk else
                       " (on average it keeps up; the GPU runs dry where it falls behind)")
        detail += (
            f"; median kernel {k['duration_us']['p50']:.1f} us, "
            f"{k['under_10us_pct']:.0f}% under 10 us, {k['launch_rate_per_s']:,.0f} launches/s"
        )
    else:
        detail = "operators too small for their dispatch cost"
    title = (
        f"The {device_word(m)} waits on the host's launch path {percent(share)} of the {of_what(m)}"
    )
    if severity == "info":
        detail += (f"; the {device_word(m)} does useful work {useful:.0f}% of the {of_what(m)} "
                   f"(over the {HEALTHY_BUSY_FLOOR_PCT:.0f}% line of a healthy run), so this is "
                   "the eager-mode overhead left, not the bottleneck")
    return [
        Finding(
            id="launch-bound",
            severity=severity,
            title=title,
            evidence=(
                f"{ms_h(cost)} {window_phrase(m)} with the {device_word(m)} idle while the host "
                f"dispatches operators and launches work"
                f"{' (' + named + ')' if named else ''}; {detail}."
            ),
            fix=(
                "Cut the host work per kernel: torch.compile(model) to fuse small ops (mode="
                "'reduce-overhead' adds CUDA graphs), CUDA graphs for static shapes "
                "(torch.cuda.make_graphed_callables), a larger batch, fused/foreach optimizers "
                "(fused=True), no Python loops over small tensors; for DDP, fewer, larger "
                "buckets."
            ),
            next_step=vendor_profile(m, "launch", ns.nsys_stats(
                "launch", "cuda_api_sum,cuda_gpu_kern_sum", training_app(m),
                extra=("--cuda-graph-trace=node",))),
            cost_s=cost / 1e3,
        )
    ]


def cold_start(m: TraceMetrics) -> list[Finding]:
    st = m.values["startup"]
    first_alloc = st["first_step_allocator_ms"]
    before = st.get("before_window_ms", 0.0)
    cost = cost_of(m, "startup") + first_alloc + before
    # Start-up before a no-steps window is weighed against the window plus that start-up: the
    # trace as recorded is mostly start-up.
    whole = m.step_total_ms + before
    share = cost / whole if whole > 0 else 0.0
    if share < WARNING_SHARE:
        return []
    parts = [f"{label} {ms_h(ms)}" for label, ms in st["top"][:3] if ms > 0]
    if first_alloc:
        parts.append(f"first allocations of the caching allocator {ms_h(first_alloc)}")
    if before:
        named = ", ".join(f"{label} {ms_h(ms)}"
                          for label, ms in m.details.get("startup_before_labels", []))
        parts.append(f"{ms_h(before)} before the first {device_word(m)} work ({named})")
    return [
        Finding(
            id="cold-start",
            severity=severity_for(share),
            title=f"This trace is start-up: {percent(share)} of it goes to initialisation, not "
            "training",
            evidence=(
                f"{ms_h(cost)} with the {device_word(m)} idle during start-up work "
                f"({'; '.join(parts) or 'driver initialisation'}): CUDA context creation, "
                "module loading, CUDA graph capture, torch.compile compilation and first "
                "allocations happen once; they say nothing about the steady state."
            ),
            fix=(
                "Profile after warm-up: torch.profiler.profile(schedule=torch.profiler.schedule("
                "wait=1, warmup=2, active=3), ...) and call prof.step() every step, or "
                "`gputop capture PID` once the job has run a few steps; if start-up itself is "
                "the problem, cache compiled kernels (TORCHINDUCTOR_FX_GRAPH_CACHE=1) and keep "
                "CUDA_MODULE_LOADING=LAZY."
            ),
            next_step=capture_or_run(m),
            cost_s=cost / 1e3,
        )
    ]
