"""Work shared with other ranks in a trace: exposed communication.
"""

from __future__ import annotations

from gputop.core.format import ms_h
from gputop.diagnostics import next_steps as ns
from gputop.diagnostics.findings import (
    Finding,
    severity_for,
)
from gputop.diagnostics.trace.causes.common import (
    COMMUNICATION_SHARE,
    cost_of,
    of_what,
    percent,
    share_of,
    training_app,
    vendor_profile,
    window_phrase,
)
from gputop.diagnostics.trace.measuring.kernels import short_kernel_name
from gputop.diagnostics.trace.measuring.metrics import TraceMetrics


def communication(m: TraceMetrics) -> list[Finding]:
    c = m.values["communication"]
    exposed = cost_of(m, "communication")
    share = share_of(m, exposed)
    if share < COMMUNICATION_SHARE:
        return []
    top = c.get("kernels") or []
    top_txt = f"; e.g. {short_kernel_name(top[0])}" if top else ""
    backend = f" ({c['backend']})" if c["backend"] else ""
    return [
        Finding(
            id="communication",
            severity=severity_for(share),
            title=f"Communication{backend} not hidden by compute holds {percent(share)} of the "
            f"{of_what(m)}",
            evidence=(
                f"collectives run {ms_h(c['kernel_ms'])} ({c['share_pct']:.1f}% of the "
                f"{of_what(m)}), {c['overlap_pct']:.0f}% of it overlapped with compute; "
                f"{ms_h(exposed)} exposed {window_phrase(m)}{top_txt}."
            ),
            fix=(
                "Overlap and shrink it: with DDP tune bucket_cap_mb (e.g. 50-100) and set "
                "gradient_as_bucket_view=True / static_graph=True; accumulate gradients under "
                "no_sync(); compress gradients with a bf16/fp16 comm hook; for FSDP enable "
                "forward/backward prefetch; check the fabric (NCCL_DEBUG=INFO shows NVLink/IB "
                "vs TCP) and measure it with nccl-tests (all_reduce_perf -b 8M -e 1G -f 2 -g "
                "GPUS); a rank that enters collectives late makes the others wait (gputop "
                "analyze on every rank's trace names it)."
            ),
            next_step=vendor_profile(m, "comm", ns.nsys("comm_rank%q{RANK}", app=training_app(m),
                                                    trace="cuda,nvtx,osrt,nccl")),
            cost_s=exposed / 1e3,
        )
    ]
