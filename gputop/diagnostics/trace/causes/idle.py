"""An idle device in a trace: ``gpu-idle`` (with the host work and the queued work it waited
for) and long gaps between kernels.
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
    capture_or_run,
    cost_of,
    device_word,
    named_labels,
    of_what,
    percent,
    share_of,
    training_app,
    vendor_profile,
    window_phrase,
)
from gputop.diagnostics.trace.measuring.intervals import intersect, total
from gputop.diagnostics.trace.measuring.metrics import TraceMetrics
from gputop.diagnostics.trace.measuring.queued import queued_label


def _host_work_ms(m: TraceMetrics, inside_long_gaps: bool) -> float:
    att = m.attribution
    if att is None:
        return 0.0
    n = max(1, len(m.details.get("primary_devices", [])))
    long_r = m.ranges.get("long_gaps", [])
    out = 0.0
    for cause in ("host", "unprofiled"):
        r = att.ranges(cause)
        in_gaps = total(intersect(r, long_r)) if long_r else 0.0
        out += in_gaps if inside_long_gaps else total(r) - in_gaps
    return out / 1e3 / n


def gpu_idle(m: TraceMetrics) -> list[Finding]:
    if not m.has_host:
        cost = cost_of(m, "unrecorded")
        share = share_of(m, cost)
        if share < WARNING_SHARE:
            return []
        return [
            Finding(
                id="gpu-idle",
                severity=severity_for(share),
                title=f"GPU idle {percent(share)} of the window; the trace has no CPU events to "
                "say why",
                evidence=(
                    f"{ms_h(cost)} of GPU idle over the device's recorded span; without host "
                    "events nothing tells whether the host, the input pipeline or a sync "
                    "caused it."
                ),
                fix=(
                    "Record the host too: torch.profiler.profile(activities=[ProfilerActivity."
                    "CPU, ProfilerActivity.CUDA], with_stack=True) around a few steps."
                ),
                next_step=capture_or_run(m),
                cost_s=cost / 1e3,
            )
        ]
    # Two causes under one id, each costed on its own: host work that launches nothing, and
    # work queued on the device that cannot start (not the host's doing).
    return [f for f in (_host_work(m), queued_work(m)) if f is not None]


def _host_work(m: TraceMetrics) -> Finding | None:
    cost = _host_work_ms(m, inside_long_gaps=False)
    share = share_of(m, cost)
    if share < WARNING_SHARE:
        return None
    named = named_labels(m, "host") or named_labels(m, "unprofiled")
    unprof = cost_of(m, "unprofiled")
    what = (
        f"host work that launches nothing: {named}"
        if named and "no profiled activity" not in named
        else "no profiled host activity (Python between ops, logging, I/O, or a wait the "
        "profiler does not see)"
    )
    return Finding(
        id="gpu-idle",
        severity=severity_for(share),
        title=(
            f"The {device_word(m)} sits idle {percent(share)} of the {of_what(m)} while the host "
            f"runs {named.split(' ')[0] if named and 'no profiled' not in named else 'other work'}"
        ),
        evidence=(
            f"{ms_h(cost)} {window_phrase(m)} with nothing queued on the {device_word(m)} while "
            f"the launching thread ran {what}"
            + (f"; {ms_h(unprof)} of it with nothing recorded on the thread" if unprof >= 1
               and named else "")
            + "."
        ),
        fix=(
            "Take that work off the step or overlap it: move per-step logging, metrics and "
            "checkpoint checks out of the loop (every N steps), do host-side preprocessing "
            "in DataLoader workers, and make I/O asynchronous; record with_stack=True to "
            "name the Python functions."
        ),
        next_step=ns.pyspy_record(m.details.get("pid"), "host.svg", app=training_app(m)),
        cost_s=cost / 1e3,
    )


# What to do about queued work, by what it waits for (trace_queued).
_QUEUED_FIX = {
    "graph": "Look inside the graphs: nsys with --cuda-graph-trace=node shows every node; host "
    "nodes, event waits and many tiny nodes leave the GPU idle between nodes, so fuse small "
    "nodes and keep host work out of the graph.",
    "stream-wait": "Find what the waited-on stream was doing when this one was ready, and start "
    "that work earlier (or give it its own stream); drop waits that are not needed "
    "(stream.wait_stream, event.wait, record_stream).",
    "other-device": "This GPU waits for another one's work: balance the work between them, or "
    "overlap the transfer between them with compute.",
    "collective": "The collectives wait for the work queued before them on their stream: "
    "overlap communication with compute (DDP buckets, FSDP prefetch) so they are ready earlier.",
    "unrecorded": "Check for other processes on the GPU (gputop's process table), host "
    "callbacks (cudaLaunchHostFunc) and work launched before the trace started; the trace "
    "records nothing the work waited for.",
}


def queued_reasons(m: TraceMetrics) -> list[tuple[str, str, float]]:
    """(reason, its words, ms) of queued idle, largest first (``measuring/queued.py``)."""
    rows = m.values.get("idle_attribution", {}).get("queued", {}).get("waits_for", [])
    return [(row["reason"], row["label"], row["ms"]) for row in rows]


def queued_work(m: TraceMetrics, floor: bool = False) -> Finding | None:
    """Idle with work already launched but not started: not the host's doing; named by what
    the work waited for."""
    cost = cost_of(m, "queued")
    share = share_of(m, cost)
    if share < WARNING_SHARE and not floor:
        return None
    reasons = queued_reasons(m)
    top = reasons[0] if reasons else ("unrecorded", queued_label("unrecorded", ""), cost)
    listed = ", ".join(f"{label} {ms_h(ms)}" for _, label, ms in reasons[:3])
    graph = top[0] == "graph"
    return Finding(
        id="gpu-idle",
        severity=severity_for(share),
        title=(f"The {device_word(m)} idles {percent(share)} of the {of_what(m)} with work already "
               f"queued on it, waiting for {top[1]}"),
        evidence=(f"{ms_h(cost)} {window_phrase(m)} in which work launched before the "
                  f"{device_word(m)} ran dry could not start; it waited for {listed or top[1]}. "
                  "The host is not the cause (a sync it sat in meanwhile waited on the same "
                  "dependency)."),
        fix=_QUEUED_FIX[top[0]],
        next_step=vendor_profile(m, "queued", ns.nsys(
            "queued", app=training_app(m), extra=("--cuda-graph-trace=node",) if graph else ())),
        cost_s=cost / 1e3,
    )


def long_gpu_gaps(m: TraceMetrics) -> list[Finding]:
    g = m.values["gpu_gaps"]
    if not g["count"]:
        return []
    cost = _host_work_ms(m, inside_long_gaps=True)
    if cost <= 0:
        return []  # every long gap is explained by another finding (sync, DataLoader, ...)
    share = share_of(m, cost)
    longest = max(g["gaps"], key=lambda row: row["dur_ms"])
    where = "at the start" if longest["start_ms"] < 1 else f"at +{ms_h(longest['start_ms'])}"
    host = longest["host"] or "no profiled activity"
    return [
        Finding(
            id="long-gpu-gaps",
            severity=severity_for(share),
            title=f"The {device_word(m)} sits idle in {g['count']} stretch(es) of 500 ms or more",
            evidence=(
                f"{g['count']} idle gaps >= 500 ms, {ms_h(g['total_ms'])} in all, {ms_h(cost)} of "
                f"it while the host ran work outside the launch path; longest "
                f"{ms_h(longest['dur_ms'])} {where}, the host in {host}."
            ),
            fix=(
                "Find what runs in the gap and take it off the step: checkpoints (save "
                "asynchronously or less often), evaluation or logging inside the loop, blocking "
                "I/O."
            ),
            next_step=vendor_profile(m, "gaps", ns.nsys_rule("gaps", "gpu_gaps", training_app(m))),
            cost_s=cost / 1e3,
        )
    ]
