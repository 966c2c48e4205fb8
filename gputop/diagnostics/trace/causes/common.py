"""What the trace rules share: thresholds with their reasons, the cost of a cause as a share of
the judged window, and the phrasing of profiler next steps.
"""

from __future__ import annotations

from gputop.core.format import ms_h
from gputop.diagnostics import next_steps as ns
from gputop.diagnostics.trace.measuring.kernels import kernel_base_name
from gputop.diagnostics.trace.measuring.metrics import TraceMetrics

# Share of the window a finding costs -> severity: findings.WARNING_SHARE, CRITICAL_SHARE.
# Below 1% of the step time a cause is not worth a line, even as information.
INFO_SHARE = 0.01
# TensorBoard's plugin flags communication from 10% of the step time (its own threshold).
COMMUNICATION_SHARE = 0.10
# "healthy" is earned: with the device idle a quarter of the window or more (busy under 75%),
# removing the idle would make the step at least 1.33x faster (the critical share), so the
# verdict names the biggest cost even when no single cause reaches 5%. The same line decides
# launch overhead: some is inherent to eager execution, so above it (the device doing useful
# work, compute and copies, not communication, which also runs while waiting for peers) the
# launch path left is information, below it a cost worth a warning.
HEALTHY_BUSY_FLOOR_PCT = 75.0
# Device-to-host reads (.item(), .cpu(), .tolist()) block the host until the value arrives
# (Nsight Systems' cuda_memcpy_sync rule lists them): while blocked the host queues nothing, so
# the device runs only on what was queued before. Blocking a quarter of the step (the critical
# share) leaves the pipeline no run-ahead: worth a warning even while other streams keep the
# device busy (then it costs no idle yet, so never more than a warning).
D2H_READ_BLOCKED_SHARE = 0.25
# TensorBoard's memory rule: peak above 90% of the device's memory.
MEMORY_PRESSURE_PCT = 90.0
# Mixed precision moves GEMM/convolution work to tensor cores; NVIDIA's AMP guidance reports
# 2-3x on such layers, so assume the conservative end: their time halves.
TENSOR_CORE_SAVING = 0.5


def percent(share: float) -> str:
    return f"{100 * share:.1f}%"


def is_amd(m: TraceMetrics) -> bool:
    return m.vendor == "amd"


def device_word(m: TraceMetrics) -> str:
    return "GPU" if m.gpu_present else "CPU compute"


def training_app(m: TraceMetrics) -> str:
    """The training command: known when the trace comes from a capture of a live process."""
    return m.details.get("app") or ns.APP


def vendor_profile(m: TraceMetrics, tag: str, nvidia: str) -> str:
    """The vendor's profiler: ``nvidia`` on NVIDIA, rocprofv3 on AMD; with no GPU in the trace
    (a CPU-only run), the host's (``ns.host_profile``)."""
    if not m.gpu_present and m.vendor is None:
        return ns.host_profile(tag, training_app(m), m.details.get("pid"))
    return ns.rocprof(tag, training_app(m)) if is_amd(m) else nvidia


def kernel_profile(m: TraceMetrics, kernel: str | None = None) -> str:
    if kernel is None:
        top = m.values.get("top_kernels") or []
        kernel = top[0]["name"] if top else None
    if is_amd(m):
        return ns.rocprof("kernels", training_app(m))
    if not kernel:
        return ns.nsys_stats("trace", "cuda_gpu_kern_sum", training_app(m))
    return ns.ncu_kernel(kernel_base_name(kernel), training_app(m))


def capture_or_run(m: TraceMetrics) -> str:
    """Record steps of the job after its warm-up: ``gputop capture`` on the live process when
    it is known, else start the job under gputop's agent."""
    pid = m.details.get("pid")
    return ns.gputop_capture(pid) if pid else f"gputop run -- {training_app(m)}"


def window_phrase(m: TraceMetrics) -> str:
    n = len(m.steps)
    if m.step_source == "ProfilerStep":
        return f"over {n} step{'s' if n != 1 else ''}"
    if m.step_source == "Optimizer.step":
        return f"over {n} iteration{'s' if n != 1 else ''}"
    return "over the recorded span (no steps)"


def of_what(m: TraceMetrics) -> str:
    return "step time" if m.step_source in ("ProfilerStep", "Optimizer.step") else "window"


def share_of(m: TraceMetrics, ms: float) -> float:
    total_ms = m.step_total_ms
    return ms / total_ms if total_ms > 0 else 0.0


def cost_of(m: TraceMetrics, cause: str) -> float:
    return m.roles_ms.get(cause, 0.0)


def named_labels(m: TraceMetrics, cause: str, limit: int = 3) -> str:
    rows = [(label, ms) for label, ms in m.top_labels(cause, limit) if ms >= 0.001]
    return ", ".join(f"{label} {ms_h(ms)}" for label, ms in rows)


def useful_busy_pct(m: TraceMetrics) -> float:
    """Compute and copies: the device busy with the program's own work (communication kernels
    also run while they wait for peers)."""
    bd = m.values["step_breakdown"]["pct"]
    return bd.get("compute", 0.0) + bd.get("memcpy", 0.0) + bd.get("memset", 0.0)


def busy_pct(m: TraceMetrics) -> float:
    """The share of the window the device did useful work: compute and copies (exposed
    communication has its own finding)."""
    bd = m.values["step_breakdown"]["pct"]
    return bd.get("compute", 0.0) + bd.get("memcpy", 0.0) + bd.get("memset", 0.0) + bd.get(
        "communication", 0.0
    )
