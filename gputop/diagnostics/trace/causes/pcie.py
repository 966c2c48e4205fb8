"""The host link in a trace: pageable copies and copy-bound steps.
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
    INFO_SHARE,
    cost_of,
    of_what,
    percent,
    share_of,
    training_app,
    vendor_profile,
    window_phrase,
)
from gputop.diagnostics.trace.measuring.busy import HOST_COPIES, copy_text, size_text
from gputop.diagnostics.trace.measuring.metrics import TraceMetrics


def pageable_memcpy(m: TraceMetrics) -> list[Finding]:
    if not m.gpu_present:
        return []
    c = m.values["memcpy"]
    # Pageable copies no compute hides are copy-bound's cost when that finding is raised.
    exposed = 0.0 if _copies_bound(m) else c["pageable_exposed_ms"]
    cost = cost_of(m, "copy") + exposed
    share = share_of(m, cost)
    if share < INFO_SHARE or (c["pageable_count"] == 0 and c["blocking_calls"] == 0):
        return []
    parts = []
    if c["pageable_count"]:
        parts.append(
            f"{c['pageable_count']} copies from/to pageable memory "
            f"({c['pageable_bytes'] / 2**20:.1f} MiB, {ms_h(c['pageable_ms'])} on the GPU)"
        )
    if c["blocking_calls"]:
        parts.append(f"{c['blocking_calls']} blocking copy calls ({ms_h(c['blocking_ms'])})")
    return [
        Finding(
            id="pageable-memcpy",
            severity=severity_for(share),
            title=f"Host-device copies are staged or blocking ({percent(share)} of the "
            f"{of_what(m)})",
            evidence=(
                f"{'; '.join(parts)} {window_phrase(m)}; {ms_h(cost)} of GPU time lost to them "
                "(idle while the host stages a copy, or a copy no compute hides)."
            ),
            fix=(
                "Copy from pinned memory asynchronously: DataLoader(pin_memory=True) and "
                "batch.to('cuda', non_blocking=True); pin buffers you reuse (tensor.pin_memory()); "
                "avoid torch.tensor(numpy_array).cuda() inside the step."
            ),
            next_step=vendor_profile(m, "copies", ns.nsys_rule(
                "copies", "cuda_memcpy_async,cuda_memcpy_sync", training_app(m), trace="cuda,osrt")),
            cost_s=cost / 1e3,
        )
    ]


def _copies_bound(m: TraceMetrics) -> bool:
    return m.gpu_present and share_of(m, m.values["busy"]["host_copies_exposed_ms"]) >= WARNING_SHARE


def copy_bound(m: TraceMetrics) -> list[Finding]:
    """Host-device copies running with no kernel beside them: the step waits on the link. Cost:
    that exposed copy time (what the step loses to copies no compute hides)."""
    if not _copies_bound(m):
        return []
    b = m.values["busy"]
    cost = b["host_copies_exposed_ms"]
    share = share_of(m, cost)
    classes, link = b["classes"], b["link"]
    rows = [(cls, classes[cls]) for cls in HOST_COPIES if classes[cls]["bytes"] > 0]
    moved = "; ".join(copy_text(cls, row, link) for cls, row in rows)
    pinned_known = [row["pinned_pct"] for _, row in rows if row.get("pinned_pct") is not None]
    pageable = bool(pinned_known) and min(pinned_known) < 50.0
    copy_ms = sum(row["ms"] for _, row in rows)
    compute_ms = classes["compute"]["ms"]
    steps = len(m.steps) if m.step_source in ("ProfilerStep", "Optimizer.step") else 0
    per_step = (f" ({size_text(sum(row['bytes'] for _, row in rows) / steps)} per step)"
                if steps > 1 else "")
    fixes = {
        "pin": "Copy from pinned memory: DataLoader(pin_memory=True), or tensor.pin_memory() "
        "once for buffers you reuse, then .to('cuda', non_blocking=True); a pageable copy is "
        "staged through a driver buffer at a fraction of the link's rate.",
        "less": "Move less over the link: keep what every step reuses on the GPU (load the "
        "dataset, weights or constants to the device once, not each step), send smaller "
        "dtypes (uint8 images, bf16 instead of fp32) and convert on the GPU, and read back "
        "only what you need.",
        "overlap": "Overlap the copies with compute: copy the next batch from pinned memory "
        "with non_blocking=True on a side stream (torch.cuda.Stream) while this one computes, "
        "so the link works while the SMs do.",
    }
    # The fix that fits first: pageable copies cannot overlap or reach the link's rate; when
    # copying takes longer than the compute, overlapping cannot hide it, only moving less can.
    if pageable:
        order = ("pin", "less", "overlap")
    elif copy_ms >= compute_ms:
        order = ("less", "overlap")
    else:
        order = ("overlap", "less")
    return [
        Finding(
            id="copy-bound",
            severity=severity_for(share),
            title=(f"Host-device copies bound the {of_what(m)}: {percent(share)} of it is "
                   "copying with no kernel running"),
            evidence=(
                f"{moved} {window_phrase(m)}{per_step}; {ms_h(cost)} of copying with no kernel "
                f"beside it, against {ms_h(compute_ms)} of compute"
                + ("; most bytes from pageable memory" if pageable else "") + "."
            ),
            fix=" ".join(fixes[k] for k in order),
            next_step=vendor_profile(m, "copies", ns.nsys_stats(
                "copies", "cuda_gpu_mem_time_sum,cuda_gpu_mem_size_sum", training_app(m))),
            cost_s=cost / 1e3,
        )
    ]
