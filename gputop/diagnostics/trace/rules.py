"""Trace rules: turn ``TraceMetrics`` into ``Finding`` objects.

Every cause is costed by the device time it explains (``trace_gaps``: each idle instant has one
cause), never by how long the host waited, and its severity comes from that cost's share of the
judged window (``severity_for``). Thresholds come from how the hardware and runtime work and
from the published rules of the tools users compare against (TensorBoard profiler plugin,
Holistic Trace Analysis, Nsight Systems expert rules); each carries its reason next to it.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from gputop.diagnostics import next_steps as ns
from gputop.diagnostics.findings import SEVERITY_RANK, Finding, order_findings
from gputop.diagnostics.trace.busy import HOST_COPIES, copy_text, size_text
from gputop.diagnostics.trace.intervals import intersect, total
from gputop.diagnostics.trace.metrics import TraceMetrics
from gputop.diagnostics.trace.queued import queued_label
from gputop.format import ms_h

# Share of the window a finding costs -> severity.
# 5%: TensorBoard's profiler plugin recommends acting on the DataLoader from 5% of the step time;
# below that a cost is within step-to-step noise and not worth a warning.
WARNING_SHARE = 0.05
# 25%: a quarter of the step; fixing this alone makes the step at least 1.33x faster.
CRITICAL_SHARE = 0.25
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



def severity_for(share: float) -> str:
    if share >= CRITICAL_SHARE:
        return "critical"
    if share >= WARNING_SHARE:
        return "warning"
    return "info"


def _pct(share: float) -> str:
    return f"{100 * share:.1f}%"


def kernel_base_name(name: str) -> str:
    """The function name ncu's ``--kernel-name`` matches (its default --kernel-name-base is the
    function name without namespace, template arguments or parameters)."""
    text = name.strip()
    if text.startswith("void "):
        text = text[5:]
    cut = len(text)
    for ch in "<(":
        i = text.find(ch)
        if i != -1:
            cut = min(cut, i)
    text = text[:cut]
    return text.rsplit("::", 1)[-1].strip() or name[:60]


def short_kernel_name(name: str, limit: int = 60) -> str:
    """Readable kernel name: namespaces kept, template arguments and parameters elided."""
    text = name.strip()
    if text.startswith("void "):
        text = text[5:]
    text = re.sub(r"\(.*$", "", text)
    out, depth = [], 0
    for ch in text:
        if ch == "<":
            if depth == 0:
                out.append("<…>")
            depth += 1
        elif ch == ">" and depth:
            depth -= 1
        elif depth == 0:
            out.append(ch)
    text = "".join(out)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _amd(m: TraceMetrics) -> bool:
    return m.vendor == "amd"


def _device(m: TraceMetrics) -> str:
    return "GPU" if m.gpu_present else "CPU compute"


def _app(m: TraceMetrics) -> str:
    """The training command: known when the trace comes from a capture of a live process."""
    return m.details.get("app") or ns.APP


def _profile(m: TraceMetrics, tag: str, nvidia: str) -> str:
    """The vendor's profiler: ``nvidia`` on NVIDIA, rocprofv3 on AMD; with no GPU in the trace
    (a CPU-only run), the host's (``ns.host_profile``)."""
    if not m.gpu_present and m.vendor is None:
        return ns.host_profile(tag, _app(m), m.details.get("pid"))
    return ns.rocprof(tag, _app(m)) if _amd(m) else nvidia


def _ncu_kernel(m: TraceMetrics, kernel: str | None = None) -> str:
    if kernel is None:
        top = m.values.get("top_kernels") or []
        kernel = top[0]["name"] if top else None
    if _amd(m):
        return ns.rocprof("kernels", _app(m))
    if not kernel:
        return ns.nsys_stats("trace", "cuda_gpu_kern_sum", _app(m))
    return ns.ncu_kernel(kernel_base_name(kernel), _app(m))


def _capture_or_run(m: TraceMetrics) -> str:
    """Record steps of the job after its warm-up: ``gputop capture`` on the live process when
    it is known, else start the job under gputop's agent."""
    pid = m.details.get("pid")
    return ns.gputop_capture(pid) if pid else f"gputop run -- {_app(m)}"


def _window_phrase(m: TraceMetrics) -> str:
    n = len(m.steps)
    if m.step_source == "ProfilerStep":
        return f"over {n} step{'s' if n != 1 else ''}"
    if m.step_source == "Optimizer.step":
        return f"over {n} iteration{'s' if n != 1 else ''}"
    return "over the recorded span (no steps)"


def _of_what(m: TraceMetrics) -> str:
    return "step time" if m.step_source in ("ProfilerStep", "Optimizer.step") else "window"


def _share(m: TraceMetrics, ms: float) -> float:
    total_ms = m.step_total_ms
    return ms / total_ms if total_ms > 0 else 0.0


def _cost(m: TraceMetrics, cause: str) -> float:
    return m.roles_ms.get(cause, 0.0)


def _named(m: TraceMetrics, cause: str, limit: int = 3) -> str:
    rows = [(label, ms) for label, ms in m.top_labels(cause, limit) if ms >= 0.001]
    return ", ".join(f"{label} {ms_h(ms)}" for label, ms in rows)


# --- rules ---------------------------------------------------------------------------------------


def dataloader_stall(m: TraceMetrics) -> list[Finding]:
    dl = m.values["dataloader"]
    if not dl["calls"]:
        return []
    cost = _cost(m, "dataloader")
    share = _share(m, cost)
    if share < WARNING_SHARE:
        return []
    workers = (
        "num_workers=0 (_SingleProcessDataLoaderIter): batches are loaded in the training "
        "process, between steps"
        if dl["single_process"]
        else f"{dl['iterator'] or 'multi-process iterator'}: the workers do not keep up"
    )
    if dl["single_process"]:
        fix = (
            "Load batches in parallel: DataLoader(..., num_workers=4 to 8 per GPU (up to the "
            "free CPU cores), pin_memory=True, persistent_workers=True, prefetch_factor=2); "
            "keep __getitem__ cheap (decode once, cache, move augmentation to the GPU)."
        )
    else:
        fix = (
            "Give the input pipeline more throughput: raise num_workers and prefetch_factor, "
            "set persistent_workers=True and pin_memory=True, and make each sample cheaper "
            "(pre-decoded/cached data, GPU-side augmentation, faster storage)."
        )
    return [
        Finding(
            id="dataloader-stall",
            severity=severity_for(share),
            title=f"The {_device(m)} waits for the DataLoader {_pct(share)} of the {_of_what(m)}",
            evidence=(
                f"{ms_h(cost)} {_window_phrase(m)} with the {_device(m)} idle while the training "
                f"loop waits in enumerate(DataLoader).__next__ ({dl['calls']} calls, "
                f"{ms_h(dl['time_ms'])} in all, longest {ms_h(dl['max_call_ms'])}); {workers}."
            ),
            fix=fix,
            next_step=ns.pyspy_record(m.details.get("pid"), "loader.svg", app=_app(m)),
            cost_s=cost / 1e3,
        )
    ]


def host_sync(m: TraceMetrics) -> list[Finding]:
    s = m.values["sync"]
    cost = _cost(m, "sync")
    share = _share(m, cost)
    reads = s.get("d2h_read_blocked_pct", 0.0) / 100
    severity = severity_for(share)
    if reads >= D2H_READ_BLOCKED_SHARE and SEVERITY_RANK[severity] < SEVERITY_RANK["warning"]:
        severity = "warning"
    elif share < INFO_SHARE:
        return []
    calls = ", ".join(f"{n} {name}" for name, n in s["calls"].items())
    item = f"{s['item_calls']} aten::item ({ms_h(s['item_ms'])}); " if s["item_calls"] else ""
    named = _named(m, "sync")
    busy = s["waited_on_busy_device_ms"]
    busy_txt = (
        f"; the other {ms_h(busy)} of waiting overlapped {_device(m)} work and costs nothing "
        "(a host waiting on a busy device is the healthy, device-bound pattern)"
        if busy > 0.05 * max(cost, 1e-9)
        else ""
    )
    if reads >= D2H_READ_BLOCKED_SHARE and share < WARNING_SHARE:
        title = (
            f"Device-to-host reads block the host {_pct(reads)} of the {_of_what(m)}: it "
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
            f"The {_device(m)} sits idle {_pct(share)} of the {_of_what(m)} while the host "
            "waits on it"
        )
    return [
        Finding(
            id="host-sync",
            severity=severity,
            title=title,
            evidence=(
                f"{ms_h(cost)} {_window_phrase(m)} with nothing running on the {_device(m)} while "
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
            next_step=_profile(m, "sync", ns.nsys_sync(_app(m))),
            cost_s=cost / 1e3,
        )
    ]


def launch_bound(m: TraceMetrics) -> list[Finding]:
    cost = _cost(m, "launch")
    share = _share(m, cost)
    if share < WARNING_SHARE:
        return []
    useful = useful_busy_pct(m)
    severity = severity_for(share)
    if useful >= HEALTHY_BUSY_FLOOR_PCT and share < CRITICAL_SHARE:
        severity = "info"
    k = m.values["kernels"]
    host_pk, gpu_pk = k.get("host_us_per_launch", 0.0), k.get("gpu_us_per_kernel", 0.0)
    named = _named(m, "launch")
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
        f"The {_device(m)} waits on the host's launch path {_pct(share)} of the {_of_what(m)}"
    )
    if severity == "info":
        detail += (f"; the {_device(m)} does useful work {useful:.0f}% of the {_of_what(m)} "
                   f"(over the {HEALTHY_BUSY_FLOOR_PCT:.0f}% line of a healthy run), so this is "
                   "the eager-mode overhead left, not the bottleneck")
    return [
        Finding(
            id="launch-bound",
            severity=severity,
            title=title,
            evidence=(
                f"{ms_h(cost)} {_window_phrase(m)} with the {_device(m)} idle while the host "
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
            next_step=_profile(m, "launch", ns.nsys_stats(
                "launch", "cuda_api_sum,cuda_gpu_kern_sum", _app(m),
                extra=("--cuda-graph-trace=node",))),
            cost_s=cost / 1e3,
        )
    ]


def communication(m: TraceMetrics) -> list[Finding]:
    c = m.values["communication"]
    exposed = _cost(m, "communication")
    share = _share(m, exposed)
    if share < COMMUNICATION_SHARE:
        return []
    top = c.get("kernels") or []
    top_txt = f"; e.g. {short_kernel_name(top[0])}" if top else ""
    backend = f" ({c['backend']})" if c["backend"] else ""
    return [
        Finding(
            id="communication",
            severity=severity_for(share),
            title=f"Communication{backend} not hidden by compute holds {_pct(share)} of the "
            f"{_of_what(m)}",
            evidence=(
                f"collectives run {ms_h(c['kernel_ms'])} ({c['share_pct']:.1f}% of the "
                f"{_of_what(m)}), {c['overlap_pct']:.0f}% of it overlapped with compute; "
                f"{ms_h(exposed)} exposed {_window_phrase(m)}{top_txt}."
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
            next_step=_profile(m, "comm", ns.nsys("comm_rank%q{RANK}", app=_app(m),
                                                    trace="cuda,nvtx,osrt,nccl")),
            cost_s=exposed / 1e3,
        )
    ]


def allocator_churn(m: TraceMetrics) -> list[Finding]:
    a = m.values["allocator"]
    if a["warmup_only"]:
        return []  # the cache warming up in the first step: cold-start's
    cost = a["idle_cost_ms"]
    share = _share(m, cost)
    if share < WARNING_SHARE:
        return []
    return [
        Finding(
            id="allocator-churn",
            severity=severity_for(share),
            title=f"The {_device(m)} waits on cudaMalloc/cudaFree {_pct(share)} of the "
            f"{_of_what(m)}",
            evidence=(
                f"{a['malloc_calls']} allocation and {a['free_calls']} free calls take "
                f"{ms_h(a['time_ms'])} {_window_phrase(m)}, {ms_h(cost)} of it with the device "
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
            next_step=_profile(m, "alloc", ns.nsys(
                "alloc", app=_app(m), trace="cuda,osrt", extra=("--cuda-memory-usage=true",))),
            cost_s=cost / 1e3,
        )
    ]


def cold_start(m: TraceMetrics) -> list[Finding]:
    st = m.values["startup"]
    first_alloc = st["first_step_allocator_ms"]
    before = st.get("before_window_ms", 0.0)
    cost = _cost(m, "startup") + first_alloc + before
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
        parts.append(f"{ms_h(before)} before the first {_device(m)} work ({named})")
    return [
        Finding(
            id="cold-start",
            severity=severity_for(share),
            title=f"This trace is start-up: {_pct(share)} of it goes to initialisation, not "
            "training",
            evidence=(
                f"{ms_h(cost)} with the {_device(m)} idle during start-up work "
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
            next_step=_capture_or_run(m),
            cost_s=cost / 1e3,
        )
    ]


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
        cost = _cost(m, "unrecorded")
        share = _share(m, cost)
        if share < WARNING_SHARE:
            return []
        return [
            Finding(
                id="gpu-idle",
                severity=severity_for(share),
                title=f"GPU idle {_pct(share)} of the window; the trace has no CPU events to "
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
                next_step=_capture_or_run(m),
                cost_s=cost / 1e3,
            )
        ]
    # Two causes under one id, each costed on its own: host work that launches nothing, and
    # work queued on the device that cannot start (not the host's doing).
    return [f for f in (_host_work(m), _queued_work(m)) if f is not None]


def _host_work(m: TraceMetrics) -> Finding | None:
    cost = _host_work_ms(m, inside_long_gaps=False)
    share = _share(m, cost)
    if share < WARNING_SHARE:
        return None
    named = _named(m, "host") or _named(m, "unprofiled")
    unprof = _cost(m, "unprofiled")
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
            f"The {_device(m)} sits idle {_pct(share)} of the {_of_what(m)} while the host "
            f"runs {named.split(' ')[0] if named and 'no profiled' not in named else 'other work'}"
        ),
        evidence=(
            f"{ms_h(cost)} {_window_phrase(m)} with nothing queued on the {_device(m)} while "
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
        next_step=ns.pyspy_record(m.details.get("pid"), "host.svg", app=_app(m)),
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
    """(reason, its words, ms) of queued idle, largest first (``trace_queued``)."""
    rows = m.values.get("idle_attribution", {}).get("queued", {}).get("waits_for", [])
    return [(row["reason"], row["label"], row["ms"]) for row in rows]


def _queued_work(m: TraceMetrics, floor: bool = False) -> Finding | None:
    """Idle with work already launched but not started: not the host's doing; named by what
    the work waited for."""
    cost = _cost(m, "queued")
    share = _share(m, cost)
    if share < WARNING_SHARE and not floor:
        return None
    reasons = queued_reasons(m)
    top = reasons[0] if reasons else ("unrecorded", queued_label("unrecorded", ""), cost)
    listed = ", ".join(f"{label} {ms_h(ms)}" for _, label, ms in reasons[:3])
    graph = top[0] == "graph"
    return Finding(
        id="gpu-idle",
        severity=severity_for(share),
        title=(f"The {_device(m)} idles {_pct(share)} of the {_of_what(m)} with work already "
               f"queued on it, waiting for {top[1]}"),
        evidence=(f"{ms_h(cost)} {_window_phrase(m)} in which work launched before the "
                  f"{_device(m)} ran dry could not start; it waited for {listed or top[1]}. "
                  "The host is not the cause (a sync it sat in meanwhile waited on the same "
                  "dependency)."),
        fix=_QUEUED_FIX[top[0]],
        next_step=_profile(m, "queued", ns.nsys(
            "queued", app=_app(m), extra=("--cuda-graph-trace=node",) if graph else ())),
        cost_s=cost / 1e3,
    )


def long_gpu_gaps(m: TraceMetrics) -> list[Finding]:
    g = m.values["gpu_gaps"]
    if not g["count"]:
        return []
    cost = _host_work_ms(m, inside_long_gaps=True)
    if cost <= 0:
        return []  # every long gap is explained by another finding (sync, DataLoader, ...)
    share = _share(m, cost)
    longest = max(g["gaps"], key=lambda row: row["dur_ms"])
    where = "at the start" if longest["start_ms"] < 1 else f"at +{ms_h(longest['start_ms'])}"
    host = longest["host"] or "no profiled activity"
    return [
        Finding(
            id="long-gpu-gaps",
            severity=severity_for(share),
            title=f"The {_device(m)} sits idle in {g['count']} stretch(es) of 500 ms or more",
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
            next_step=_profile(m, "gaps", ns.nsys_rule("gaps", "gpu_gaps", _app(m))),
            cost_s=cost / 1e3,
        )
    ]


def pageable_memcpy(m: TraceMetrics) -> list[Finding]:
    if not m.gpu_present:
        return []
    c = m.values["memcpy"]
    # Pageable copies no compute hides are copy-bound's cost when that finding is raised.
    exposed = 0.0 if _copies_bound(m) else c["pageable_exposed_ms"]
    cost = _cost(m, "copy") + exposed
    share = _share(m, cost)
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
            title=f"Host-device copies are staged or blocking ({_pct(share)} of the "
            f"{_of_what(m)})",
            evidence=(
                f"{'; '.join(parts)} {_window_phrase(m)}; {ms_h(cost)} of GPU time lost to them "
                "(idle while the host stages a copy, or a copy no compute hides)."
            ),
            fix=(
                "Copy from pinned memory asynchronously: DataLoader(pin_memory=True) and "
                "batch.to('cuda', non_blocking=True); pin buffers you reuse (tensor.pin_memory()); "
                "avoid torch.tensor(numpy_array).cuda() inside the step."
            ),
            next_step=_profile(m, "copies", ns.nsys_rule(
                "copies", "cuda_memcpy_async,cuda_memcpy_sync", _app(m), trace="cuda,osrt")),
            cost_s=cost / 1e3,
        )
    ]


def _copies_bound(m: TraceMetrics) -> bool:
    return m.gpu_present and _share(m, m.values["busy"]["host_copies_exposed_ms"]) >= WARNING_SHARE


def copy_bound(m: TraceMetrics) -> list[Finding]:
    """Host-device copies running with no kernel beside them: the step waits on the link. Cost:
    that exposed copy time (what the step loses to copies no compute hides)."""
    if not _copies_bound(m):
        return []
    b = m.values["busy"]
    cost = b["host_copies_exposed_ms"]
    share = _share(m, cost)
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
            title=(f"Host-device copies bound the {_of_what(m)}: {_pct(share)} of it is "
                   "copying with no kernel running"),
            evidence=(
                f"{moved} {_window_phrase(m)}{per_step}; {ms_h(cost)} of copying with no kernel "
                f"beside it, against {ms_h(compute_ms)} of compute"
                + ("; most bytes from pageable memory" if pageable else "") + "."
            ),
            fix=" ".join(fixes[k] for k in order),
            next_step=_profile(m, "copies", ns.nsys_stats(
                "copies", "cuda_gpu_mem_time_sum,cuda_gpu_mem_size_sum", _app(m))),
            cost_s=cost / 1e3,
        )
    ]


def no_tensor_cores(m: TraceMetrics) -> list[Finding]:
    tc = m.values["tensor_cores"]
    if not m.gpu_present or not m.devices:
        return []
    dev = m.devices[0]
    major = dev.compute_major
    if major is None:
        return []
    # Tensor cores from compute capability 7.0 (Volta); AMD matrix cores on CDNA (gfx9, major 9).
    capable = major >= 9 if _amd(m) else major >= 7
    if not capable:
        return []
    # When tensor cores already do most of the matrix work whose precision is known, mixed
    # precision is on and the remaining fp32 GEMMs are usually deliberate (loss, norms).
    if tc["tensor_core_share_of_matrix_pct"] >= 50.0:
        return []
    simt_ms = tc["simt_kernel_ms"]
    saving = TENSOR_CORE_SAVING * simt_ms
    share = _share(m, saving)
    if share < INFO_SHARE:
        return []
    top = m.details.get("top_non_tensor_core_kernel")
    top_txt = f"; top: {short_kernel_name(top)}" if top else ""
    unknown = tc["unknown_kernel_ms"]
    unknown_txt = (
        f"; {ms_h(unknown)} more of matrix kernels do not say their precision" if unknown else ""
    )
    # Info only: precision is a modelling choice a trace cannot judge (fp32 may be deliberate).
    return [
        Finding(
            id="no-tensor-cores",
            severity="info",
            title=f"Matrix work runs without tensor cores on {dev.name}",
            evidence=(
                f"{ms_h(simt_ms)} of GEMM/convolution kernels run in fp32 on the SIMT units "
                f"(compute capability {tc['compute_capability']}; tensor cores do "
                f"{tc['tensor_core_share_of_matrix_pct']:.0f}% of the matrix time whose "
                f"precision the names tell){top_txt}{unknown_txt}; mixed precision would save "
                f"an estimated {ms_h(saving)} ({_pct(share)} of the {_of_what(m)})."
            ),
            fix=(
                "Use mixed precision: torch.autocast('cuda', dtype=torch.bfloat16) on Ampere and "
                "newer, float16 with torch.amp.GradScaler on Volta/Turing; at least allow TF32 "
                "on Ampere+ (torch.set_float32_matmul_precision('high')); keep GEMM dimensions "
                "multiples of 8."
            ),
            next_step=_ncu_kernel(m, top),
            cost_s=saving / 1e3,
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
                next_step=_profile(m, "memory", ns.nsys(
                    "memory", app=_app(m), trace="cuda", extra=("--cuda-memory-usage=true",))),
                cost_s=0.0,
                gpu=int(dev) if dev.isdigit() else None,
            )
        )
    return out


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


def host_dataloader(m: TraceMetrics) -> list[Finding]:
    """GPU activity not recorded: the DataLoader's share of the training thread's step time
    (TensorBoard's DataLoader share is this same host time), not a device's idle."""
    dl = m.values["dataloader"]
    ms = m.values["host_breakdown"]["ms"].get("dataloader", 0.0)
    share = _share(m, ms)
    if not dl["calls"] or share < WARNING_SHARE:
        return []
    workers = ("num_workers=0: batches are loaded in the training process"
               if dl["single_process"] else "the workers do not keep up")
    return [Finding(
        id="dataloader-stall",
        severity=severity_for(share),
        title=(f"The training loop waits for the DataLoader {_pct(share)} of the {_of_what(m)} "
               "(GPU activity not recorded)"),
        evidence=(f"the training thread spent {ms_h(ms)} {_window_phrase(m)} in "
                  f"enumerate(DataLoader).__next__ ({dl['calls']} calls, longest "
                  f"{ms_h(dl['max_call_ms'])}); {workers}. Whether the GPU idled meanwhile is "
                  "not in the trace."),
        fix=("Load batches in parallel: DataLoader(num_workers=4 to 8 per GPU, pin_memory=True, "
             "persistent_workers=True, prefetch_factor=2), and record the GPU too "
             "(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) to see what it costs."),
        next_step=_capture_or_run(m),
        cost_s=ms / 1e3,
    )]


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
        f" (the {_device(m)} is busy only {busy_pct(m):.0f}% of the {_of_what(m)}, under the "
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
    share = _share(m, cost_ms)
    if cause == "queued":
        f = _queued_work(m, floor=True)
        title, evidence, fix, next_step, fid = f.title, f.evidence, f.fix, f.next_step, f.id
    else:
        labels = _named(m, cause) or cause
        title = f"The {_device(m)} idles {_pct(share)} of the {_of_what(m)} in {cause}"
        evidence = f"{ms_h(cost_ms)} {_window_phrase(m)}: {labels}"
        fid = _rule_id(cause)
        fix = "See the cause above."
        next_step = _profile(m, "idle", ns.nsys("idle", app=_app(m)))
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
    rest = ", ".join(f"{cause} {100 * _share(m, ms):.1f}%" for cause, ms in idle[:4])
    device = "GPU" if m.gpu_present else "CPU compute"
    head = f"{device} busy {busy:.0f}% of the {_of_what(m)} {_window_phrase(m)}"
    if rest:
        return f"{head}; the idle rest ({rest}) has no cause at 5% or more"
    return head
