"""Metrics of one loaded trace: where the device time went, and why it idled.

The window judged is the steps, or else the span both host and device recorded
(``measuring/steps.py``). Each instant of it, on every device, is given to one role: busy (compute,
exposed communication, copies, memsets) or an idle cause found by gap attribution
(``measuring/gaps.py``: sync, blocking copy, allocator, start-up, DataLoader, launch path, host work,
nothing profiled, queued on the device, not recorded). Findings cost the idle time their cause
explains, so the step-time bar and the findings add up.

Definitions kept comparable with the tools users check against:

- steps as the TensorBoard profiler plugin makes them (device-aware ProfilerStep spans);
- ``temporal`` and ``idle_split`` exactly as Holistic Trace Analysis computes them
  (``measuring/hta.py``), next to gputop's own attribution;
- long gaps from Nsight Systems' ``gpu_gaps`` rule (500 ms).

Traces without GPU activity use the same code: the operators are the CPU's own compute and a
collective run by a CPU thread (gloo) is the device's communication.
"""

from __future__ import annotations

import statistics
from collections import Counter, defaultdict
from collections.abc import Callable

from gputop.diagnostics.trace.loading.load import Event, TraceData
from gputop.diagnostics.trace.measuring.busy import busy_breakdown, copy_class
from gputop.diagnostics.trace.measuring.compiled import compiled_summary
from gputop.diagnostics.trace.measuring.gaps import (
    BUSY_ROLES,
    CPU_DEVICE,
    CPU_WAKE_US,
    IDLE_CAUSES,
    ROLES,
    Activity,
    Launch,
    as_int,
    attribute,
    cpu_activities,
    events_by_corr,
    gpu_activities,
    main_thread,
    per_step,
)
from gputop.diagnostics.trace.measuring.host import build_thread_states, op_kind
from gputop.diagnostics.trace.measuring.hta import stream_sync_activities, temporal_breakdown
from gputop.diagnostics.trace.measuring.intervals import (
    intersect,
    merge,
    total,
)
from gputop.diagnostics.trace.measuring.kernels import (
    GRAPH_LAUNCH_APIS,
    LAUNCH_APIS,
)
from gputop.diagnostics.trace.measuring.links import host_link
from gputop.diagnostics.trace.measuring.measures import (
    last_submission,
    measure_allocator,
    measure_communication,
    measure_copies,
    measure_dataloader,
    measure_host_per_kernel,
    measure_long_gaps,
    measure_startup,
    measure_sync,
    span,
)
from gputop.diagnostics.trace.measuring.queued import Queued, queued_inputs, waits_for
from gputop.diagnostics.trace.measuring.stats import kernel_stats, memory, pct, r3, walk_host_ops
from gputop.diagnostics.trace.measuring.steps import Step, find_window, profiler_sync, steady_steps
from gputop.diagnostics.trace.measuring.trace_metrics import TraceMetrics
from gputop.diagnostics.trace.measuring.unrecorded import host_breakdown, unrecorded_gpu

# A device whose busy time is under a tenth of the busiest one's is not one the program drives
# (a context's stray memset on a second GPU): it would only dilute the averages.
PRIMARY_DEVICE_SHARE = 0.1
ROLE_ORDER = ROLES  # compute, communication, memcpy, memset, then the idle causes


def _copy_kinds(acts: list[Activity]):
    by_corr: dict[int, list[Activity]] = defaultdict(list)
    for a in acts:
        if a.kind == "memcpy" and a.correlation is not None:
            by_corr[a.correlation].append(a)

    def copy_kind(rt: Event) -> tuple[str | None, bool]:
        corr = rt.args.correlation if rt.args else None
        for a in by_corr.get(corr, ()) if isinstance(corr, int) else ():
            pageable = "Pageable" in a.name
            for direction in ("DtoH", "HtoD", "DtoD", "HtoH", "PtoP"):
                if direction in a.name:
                    return direction, pageable
            return None, pageable
        return None, False

    return copy_kind


def compute_metrics(data: TraceData) -> TraceMetrics:
    gacts = gpu_activities(data)
    gpu_present = bool(gacts)
    runtime_sorted = sorted(data.runtime, key=lambda e: e.ts)
    launches: dict[int, Launch] = events_by_corr(runtime_sorted)
    device_end_by_corr: dict[int, float] = {}
    for a in gacts:
        if a.correlation is not None and a.end > device_end_by_corr.get(a.correlation, -1.0):
            device_end_by_corr[a.correlation] = a.end

    # The profiler's own synchronize at stop is not the program's.
    host_steps_end = max((ev.ts + ev.dur for ev in data.steps), default=None)
    prof_sync = profiler_sync(data.cpu_ops, host_steps_end, runtime_sorted)
    runtime_prog = [rt for rt in runtime_sorted if rt is not prof_sync]
    # A GPU program whose GPU activity is missing: only its host is assessed.
    unrecorded = None if gpu_present else unrecorded_gpu(data)
    states = build_thread_states(data.cpu_ops, data.python, runtime_prog, _copy_kinds(gacts),
                                 cpu_model=not gpu_present and unrecorded is None)
    if gpu_present or unrecorded is not None:
        acts = gacts
    else:
        acts, launches = cpu_activities(data, states)
    device_span = (min(a.ts for a in acts), max(a.end for a in acts)) if acts else None
    win = find_window(data, runtime_sorted, device_end_by_corr, device_span)
    if unrecorded is not None and win.source == "recorded span":
        win = win._replace(source="host span")
    has_host = bool(data.cpu_ops or data.runtime or data.python)

    launches_by_tid: dict[object, int] = Counter(
        rt.tid for rt in runtime_prog if rt.name in LAUNCH_APIS or rt.name in GRAPH_LAUNCH_APIS
    )
    main_tid = main_thread(data, launches_by_tid)

    def attributed(steps: list[Step]):
        slots = merge((s.start, s.end) for s in steps)
        att = attribute(acts, launches, states, slots, main_tid, has_host,
                        wake_us=0.0 if gpu_present else CPU_WAKE_US, keep_queued=gpu_present)
        busy_by_dev = {dev: total(intersect(att.busy[dev], slots)) for dev in att.devices}
        return att, slots, busy_by_dev, _primary_devices(busy_by_dev)

    att, slots, busy_by_dev, primary = attributed(win.steps)
    # One-off first or last steps are judged apart (trace_steps.steady_steps), by the time a
    # finding could charge in each step: everything but compute and communication.
    rows = per_step(att, win.steps, primary)
    steady = steady_steps(win, [(r["total"] - r["compute"] - r["communication"]) * 1e3
                                for r in rows])
    one_off_rows = [rows[win.steps.index(step)] for step, _, _ in steady.one_offs]
    if steady.one_offs:
        win = steady
        att, slots, busy_by_dev, primary = attributed(win.steps)
        rows = per_step(att, win.steps, primary)
    steps = win.steps
    w0, w1 = win.start, win.end

    m = TraceMetrics(
        path=data.path,
        gpu_present=gpu_present,
        vendor=_vendor(data, runtime_sorted, gpu_present),
        devices=data.devices,
        rank=data.rank,
        world_size=data.world_size,
        steps=steps,
        step_source=win.source,
        window=(w0, w1),
        attribution=att,
        states=states,
        has_host=has_host,
        gpu_unrecorded=unrecorded,
    )
    _describe(m, data, win)
    compiled = compiled_summary(data.cpu_ops, (win.start, win.end), data.steps)
    if compiled is not None:
        m.values["compiled"] = compiled

    m.details["primary_devices"] = primary
    # Each collective (start, end, stream), for comparing the ranks of a job (trace_ranks).
    m.details["collectives"] = [(a.ts, a.end, a.stream) for a in acts
                                if a.kind == "comm" and w0 <= a.ts < w1]
    _step_breakdown(m, rows)
    if unrecorded is not None:
        m.values["host_breakdown"] = host_breakdown(states, main_tid, slots, steps)
    m.values["one_offs"] = [
        _one_off(step, position, excess, row, acts, prof_sync)
        for (step, position, excess), row in zip(win.one_offs, one_off_rows)
    ]
    moves = [a for a in gacts if a.kind == "memcpy" or a.kind == "memset"]
    m.values["busy"] = busy_breakdown(att, moves, slots, primary, m.step_total_ms, gpu_present,
                                      host_link(_device_name(data, primary)), busy_by_dev)

    slots_total = total(slots)
    gpu_busy_r = (att.busy[att.devices[0]] if len(att.devices) == 1
                  else merge(r for b in att.busy.values() for r in b))
    m.values["gpu"] = {
        "busy_pct_of_steps": (
            pct(sum(busy_by_dev[d] for d in primary) / len(primary), slots_total)
            if gpu_present and primary else None
        ),
        "per_device": {},
    }
    if gpu_present:
        _hta(m, data, acts, launches, gpu_busy_r, slots, win)
    m.values["idle_attribution"] = _idle_attribution(
        m, lambda: _queued_inputs(data, runtime_prog))
    ops = _host_ops(data)
    measure_dataloader(m, ops["dataloader-next"], slots)
    measure_sync(m, ops["item"], states, runtime_prog, slots, prof_sync,
          lambda: last_submission(launches, device_end_by_corr, main_tid, w1))
    measure_copies(m, gacts, runtime_prog, slots, att)
    measure_communication(m, att, slots, data, ops["collective"], acts)
    launch_calls = sum(
        1 for rt in runtime_prog
        if (rt.name in LAUNCH_APIS or rt.name in GRAPH_LAUNCH_APIS) and w0 <= rt.ts < w1
    )
    kernels, tensor_cores, top_kernels, top_simt = kernel_stats(
        gacts, launches if gpu_present else {}, (w0, w1), len(steps), launch_calls, data
    )
    m.values["kernels"] = kernels
    m.values["tensor_cores"] = tensor_cores
    m.values["top_kernels"] = top_kernels
    m.details["top_non_tensor_core_kernel"] = top_simt
    measure_host_per_kernel(m, states, slots, kernels)
    measure_allocator(m, data, runtime_prog, slots)
    measure_startup(m, win)
    measure_long_gaps(m, att, states)
    _, top_ops = walk_host_ops((st.all_ops for st in states.values()), w0, w1)
    m.values["top_ops"] = top_ops
    m.values["memory"] = memory(data)
    m.ranges["host_collectives"] = intersect(merge(span(ev) for ev in ops["collective"]), slots)
    _assessment(m, data, has_dataloader=bool(ops["dataloader-next"] or ops["dataloader"]))
    return m


def _primary_devices(busy_by_dev: dict[int, float]) -> list[int]:
    """The devices the program drives: each busy a tenth of the busiest one's time or more."""
    top_busy = max(busy_by_dev.values(), default=0.0)
    return [d for d, b in busy_by_dev.items() if b >= PRIMARY_DEVICE_SHARE * top_busy] or list(
        busy_by_dev)


def _one_off(step: Step, position: str, excess_us: float, row: dict[str, float], acts,
             prof_sync: Event | None) -> dict:
    """A step left out as a one-off: its time, how much more a finding could charge in it than
    in the costliest steady step, and what its time went to (``row``: its step breakdown)."""
    top = sorted(((role, ms) for role, ms in row.items() if role in ROLES and ms > 0),
                 key=lambda kv: -kv[1])[:3]
    out = {
        "step": step.name,
        "position": position,
        "ms": r3((step.end - step.start) / 1e3),
        "excess_ms": r3(excess_us / 1e3),
        "top": [[role, r3(ms)] for role, ms in top],
    }
    h2d = sum(a.nbytes for a in acts if a.kind == "memcpy" and step.start <= a.ts < step.end
              and copy_class(a.name) == "h2d")
    if h2d:
        out["h2d_bytes"] = h2d
    if position == "last" and prof_sync is not None and step.host_end <= prof_sync.ts < step.end:
        out["profiler_stop"] = True  # the step held the profiler's closing synchronize
    return out


def _queued_inputs(data: TraceData, runtime_prog: list[Event]) -> Queued:
    """What names the dependencies of queued work: CUPTI's Stream Wait Event records, the
    threads' cudaStreamWaitEvent calls, and which launches were CUDA graph launches."""
    waits = []
    for ev in data.gpu_syncs:
        args = ev.args
        if ev.name == "Stream Wait Event" and args is not None:
            waits.append((as_int(args.device if args.device is not None else ev.pid),
                           as_int(args.stream if args.stream is not None else ev.tid), ev.ts,
                           as_int(args.wait_on_stream) if args.wait_on_stream is not None
                           else None))
    graphs = frozenset(rt.args.correlation for rt in runtime_prog
                       if rt.name in GRAPH_LAUNCH_APIS and rt.args is not None
                       and isinstance(rt.args.correlation, int))
    return queued_inputs(waits, runtime_prog, graphs)


def _host_ops(data: TraceData) -> dict[str, list[Event]]:
    """The operators the metrics quote, in one pass: DataLoader fetches, aten::item calls,
    collectives seen from the host."""
    out: dict[str, list[Event]] = {"dataloader-next": [], "dataloader": [], "item": [],
                                   "collective": []}
    for ev in data.cpu_ops:
        kind = op_kind(ev.name, ev.cat)
        if kind in ("collective-op", "collective-mark"):
            out["collective"].append(ev)
        elif kind in out:
            out[kind].append(ev)
    return out


def _vendor(data: TraceData, runtime_sorted: list[Event], gpu_present: bool) -> str | None:
    vendor = None
    if data.devices:
        vendor = "amd" if data.devices[0].is_amd else "nvidia"
    if any(rt.name.startswith("hip") for rt in runtime_sorted[:100]):
        vendor = "amd"
    return vendor if (gpu_present or data.devices) else None


def _device_name(data: TraceData, primary: list[int]) -> str | None:
    """The name of the (first) device the program drives, from deviceProperties."""
    by_index = {d.index: d.name for d in data.devices}
    for dev in primary:
        if by_index.get(dev):
            return by_index[dev]
    return data.devices[0].name if data.devices else None


def _describe(m: TraceMetrics, data: TraceData, win) -> None:
    """The trace, the window judged, the steps."""
    w0, w1 = m.window
    v = m.values
    v["trace"] = {
        "events": data.n_events,
        "schema": "2021" if any(ev.cat == "Operator" for ev in data.cpu_ops[:20]) else "current",
        "device": data.devices[0].name if data.devices else None,
        "device_count_in_header": len(data.devices),
        "vendor": m.vendor,
        "rank": data.rank,
        "world_size": data.world_size,
        "gpu_activity": m.gpu_present,
        "gpu_unrecorded": m.gpu_unrecorded,
        "cpu_events": m.has_host,
    }
    profiled = data.profiler_span
    v["window"] = {
        "start_us": r3(w0),
        "dur_ms": r3((w1 - w0) / 1e3),
        "steps_from": win.source,
        "judged": window_statement(win.source, len(win.steps), m.gpu_present) + "".join(
            f"; the {position} step ({step.name}) left out as a one-off, "
            f"{excess / 1e3:.1f} ms more idle or copy time than any steady step"
            for step, position, excess in win.one_offs),
        "left_out_before_ms": r3(win.before_us / 1e3),
        "left_out_after_ms": r3(win.after_us / 1e3),
        "profiled_ms": r3((profiled[1] - profiled[0]) / 1e3) if profiled else None,
    }
    steps = m.steps
    step_ms = [(s.end - s.start) / 1e3 for s in steps]
    v["steps"] = {
        "count": len(steps) if win.source in ("ProfilerStep", "Optimizer.step") else 0,
        "names": [s.name for s in steps],
        "time_ms": [r3(x) for x in step_ms],
        "mean_ms": r3(statistics.fmean(step_ms)),
        "median_ms": r3(statistics.median(step_ms)),
        "max_ms": r3(max(step_ms)),
    }


def window_statement(source: str, n_steps: int, gpu_present: bool) -> str:
    device = "GPU" if gpu_present else "CPU compute"
    if source == "ProfilerStep":
        extended = ", extended to the end of their GPU work" if gpu_present else ""
        return f"{n_steps} profiler step(s) (ProfilerStep#N{extended})"
    if source == "Optimizer.step":
        return (f"{n_steps} iteration(s) between Optimizer.step calls (no ProfilerStep; the part "
                "before the first optimizer step is left out)")
    if source == "recorded span":
        return (f"no steps: the span in which both the host and the {device} were recorded "
                "(the profiler's start and stop edges left out)")
    if source == "device span":
        return "no CPU events: the device's own span; only what the device shows is assessed"
    if source == "host span":
        return "no steps: the host's recorded span (GPU activity not recorded)"
    return "nothing to judge"


def _step_breakdown(m: TraceMetrics, rows: list[dict[str, float]]) -> None:
    """``rows``: per step, the ms of each role (``trace_gaps.per_step``)."""
    totals = {role: sum(r[role] for r in rows) for role in (*ROLE_ORDER, "total")}
    m.roles_ms, m.per_step_roles_ms = totals, rows
    m.values["step_breakdown"] = {
        "ms": {k: r3(x) for k, x in totals.items()},
        "pct": {k: pct(totals[k], totals["total"]) for k in ROLE_ORDER},
        "per_step_ms": [{k: r3(x) for k, x in row.items()} for row in rows],
        "devices": m.details["primary_devices"],
    }


def _idle_attribution(m: TraceMetrics, name_inputs: Callable[[], Queued]) -> dict:
    """Per idle cause: its time, share of the window and, for causes that name something,
    what the launching thread was doing."""
    out = {}
    step_total = m.step_total_ms
    for cause in IDLE_CAUSES:
        ms = m.roles_ms.get(cause, 0.0)
        if ms <= 0:
            continue
        row = {"ms": r3(ms), "pct": pct(ms, step_total)}
        if cause not in ("queued", "unrecorded"):
            row["top"] = [[label, r3(x)] for label, x in m.top_labels(cause, 5)]
        if cause == "queued" and m.attribution is not None:
            row["waits_for"] = waits_for(m.attribution, name_inputs,
                                         len(m.details.get("primary_devices", [])))
        out[cause] = row
    return out


def _hta(m, data, acts, launches, gpu_busy_r, slots, win) -> None:
    # HTA-comparable set: the activity launched by runtime calls inside the host steps, plus,
    # as HTA counts them, device-side sync waits drawn on a stream (non-compute time).
    stream_syncs = stream_sync_activities(data.gpu_syncs)
    if win.source in ("ProfilerStep", "Optimizer.step"):
        host_w0, host_w1 = win.steps[0].start, win.steps[-1].host_end
        launched = [
            a for a in acts + stream_syncs
            if a.correlation in launches and host_w0 <= launches[a.correlation].ts <= host_w1
        ]
    else:
        launched = acts + stream_syncs
    launched = sorted(launched) if launched else acts
    temporal_breakdown(m.values, launched, launches, gpu_busy_r, acts, slots)


def _assessment(m: TraceMetrics, data: TraceData, has_dataloader: bool) -> None:
    a, na = m.assessed, m.not_assessed
    if data.dropped_events:
        na.append(f"{data.dropped_events} event(s) with a negative or non-finite time: skipped "
                  "(the file is damaged or its writer is broken)")
    a.append("window judged: " + m.values["window"]["judged"])
    before = m.values["window"]["left_out_before_ms"]
    if m.step_source in ("recorded span", "device span") and before >= 1:
        na.append(f"{before:,.0f} ms recorded before the window (one side only, or before the "
                  "first step)")
    if m.step_source == "Optimizer.step":
        na.append("ProfilerStep#N: none in the trace; iterations taken from Optimizer.step")
    elif m.step_source not in ("ProfilerStep",):
        na.append("per-step times: no ProfilerStep#N or Optimizer.step in the trace")
    if has_dataloader:
        a.append("DataLoader share of the step time")
    else:
        na.append("DataLoader share: no enumerate(DataLoader) events in the trace")
    if m.gpu_present:
        if m.has_host:
            a.append("every idle GPU interval attributed to what the launching thread was doing "
                     "(sync, DataLoader, allocator, start-up, launch path, host work)")
        else:
            na.append("causes of GPU idle: the trace has no CPU events (only the GPU side is "
                      "assessed)")
        a.append("GPU busy/idle (and HTA's idle split), kernels, copies, communication, "
                 "tensor cores")
        if m.vendor == "amd":
            a.append("ROCm/HIP runtime and kernels")
        if not data.devices:
            na.append("tensor-core capability and memory capacity: no deviceProperties")
        unknown = m.values["tensor_cores"]["unknown_kernel_ms"]
        if unknown > 0:
            na.append(f"precision of {unknown:,.1f} ms of matrix kernels whose names do not say "
                      "it (counted as unknown)")
    elif m.gpu_unrecorded:
        a.append("the host only: the training thread's time by state (DataLoader, sync, "
                 "launch path, host work), step times, top operators")
        na.append(f"the GPU: its activity was not recorded ({m.gpu_unrecorded}); no device "
                  "verdict (busy/idle, kernels, copies, communication, tensor cores) - record "
                  "with activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]")
    else:
        a.append("CPU compute (the operators) and its idle time attributed like a GPU's")
        na.append(
            "GPU metrics (busy/idle, kernels, copies, communication, tensor cores): "
            "CPU-only trace, no GPU activity"
        )
    mem = m.values.get("memory", {})
    if mem.get("peak_allocated_bytes"):
        a.append("peak GPU memory")
    elif mem.get("peak_rise_bytes"):
        a.append("GPU memory rise within the trace")
        na.append("memory capacity use: memory events carry no totals (older schema)")
    else:
        na.append("peak memory: no GPU memory events (profile_memory=False)")


__all__ = [
    "BUSY_ROLES",
    "CPU_DEVICE",
    "ROLE_ORDER",
    "TraceMetrics",
    "compute_metrics",
    "window_statement",
]
