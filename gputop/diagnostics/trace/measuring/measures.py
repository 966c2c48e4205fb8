"""The measures ``metrics.compute_metrics`` fills in, one function per part of the step: the
DataLoader, host syncs, copies, communication, host time per kernel, the allocator, start-up and
long gaps. Each writes its part into the ``TraceMetrics`` it is given."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable
from typing import TYPE_CHECKING

from gputop.diagnostics.trace.loading.load import Event
from gputop.diagnostics.trace.measuring.gaps import (
    IDLE_CAUSES,
    Activity,
    Attribution,
    Launch,
)
from gputop.diagnostics.trace.measuring.intervals import (
    Ranges,
    intersect,
    merge,
    merge_sorted,
    total,
)
from gputop.diagnostics.trace.measuring.kernels import (
    ALLOC_APIS,
    DATALOADER_PREFIX,
    SYNC_APIS,
    is_blocking_copy_api,
)
from gputop.diagnostics.trace.measuring.stats import pct, r3

if TYPE_CHECKING:  # the measures fill in what metrics defines; a type, not an arrow
    from gputop.diagnostics.trace.measuring.trace_metrics import TraceMetrics
# Nsight Systems' "GPU Gaps" expert rule (gpu_gaps) reports idle stretches of 500 ms or more.
LONG_GAP_US = 500_000.0


def span(ev: Event) -> tuple[float, float]:
    return (ev.ts, ev.ts + ev.dur)


def measure_dataloader(m: TraceMetrics, fetches: list[Event], slots: Ranges) -> None:
    w0, w1 = m.window
    dl = [ev for ev in fetches if ev.ts < w1 and ev.ts + ev.dur > w0]
    cost = m.roles_ms.get("dataloader", 0.0)
    m.values["dataloader"] = {
        "calls": len(dl),
        "time_ms": r3(total(intersect(merge(span(ev) for ev in dl), slots)) / 1e3),
        "exposed_ms": r3(cost),
        "share_pct": pct(cost, m.step_total_ms),
        "max_call_ms": r3(max((ev.dur for ev in dl), default=0.0) / 1e3),
        "single_process": any("_SingleProcessDataLoaderIter" in ev.name for ev in dl),
        "iterator": dl[0].name[len(DATALOADER_PREFIX):].split(".")[0] if dl else None,
    }


def last_submission(launches: dict[int, Launch], device_end_by_corr: dict[int, float],
                     tid: object, before: float) -> float:
    """When ``tid`` last called the runtime for device work (a launch or copy whose activity
    the trace has), before ``before``."""
    last = float("-inf")
    for corr, launch in launches.items():
        if launch.tid == tid and launch.ts < before and launch.ts > last and (
                corr in device_end_by_corr):
            last = launch.ts
    return last


def measure_sync(m, item_ops, states, runtime_prog, slots, prof_sync,
          last_submission: Callable[[], float]) -> None:
    w0, w1 = m.window
    blocked = merge(r for st in states.values() for r in st.painted.get("sync", []))
    blocked_ms = total(intersect(blocked, slots)) / 1e3
    n_threads_blocked = sum(1 for st in states.values() if st.painted.get("sync"))
    cost = m.roles_ms.get("sync", 0.0)
    counts: Counter = Counter()
    for rt in runtime_prog:
        if not (w0 <= rt.ts < w1):
            continue
        if rt.name in SYNC_APIS:
            counts[rt.name] += 1
    items = [ev for ev in item_ops if ev.name == "aten::item" and w0 <= ev.ts < w1]
    # The training thread blocked in device-to-host reads (Nsight Systems' cuda_memcpy_sync).
    main = states.get(m.attribution.main_tid) if m.attribution else None
    # A read after which the thread submits no more device work blocks nothing (a final
    # .cpu() of the output while the GPU finishes): the pipeline has nothing left to run ahead.
    reads = main.reads if main is not None else []
    if reads:
        last = last_submission()
        reads = [r for r in reads if r[1] <= last]
    reads_ms = total(intersect(reads, slots)) / 1e3
    m.values["sync"] = {
        "host_blocked_ms": r3(blocked_ms),
        "host_blocked_pct": pct(blocked_ms, m.step_total_ms * max(1, n_threads_blocked)),
        "gpu_idle_cost_ms": r3(cost),
        "waited_on_busy_device_ms": r3(max(0.0, blocked_ms - cost)),
        "calls": dict(counts.most_common()),
        "item_calls": len(items),
        "item_ms": r3(sum(ev.dur for ev in items) / 1e3),
        "d2h_read_blocked_ms": r3(reads_ms),
        "d2h_read_blocked_pct": pct(reads_ms, m.step_total_ms),
        "profiler_sync_excluded_ms": r3(prof_sync.dur / 1e3) if prof_sync is not None else 0.0,
    }
    m.details["sync_labels"] = m.top_labels("sync", 4)


def measure_copies(m, gacts, runtime_prog, slots, att: Attribution) -> None:
    """Copies the device cannot overlap: from/to pageable host memory (staged through a driver
    buffer) and blocking copy calls. Device-to-host reads are the host-sync finding's."""
    w0, w1 = m.window
    copies = [a for a in gacts if a.kind == "memcpy" and w0 <= a.ts < w1]
    pageable = [a for a in copies if "Pageable" in a.name and "DtoH" not in a.name]
    by_kind: dict[str, dict] = {}
    for a in copies:
        parts = a.name.split()
        kind = parts[1] if a.name.startswith("Memcpy ") and len(parts) > 1 else a.name
        row = by_kind.setdefault(kind, {"count": 0, "bytes": 0, "ms": 0.0})
        row["count"] += 1
        row["bytes"] += a.nbytes
        row["ms"] += (a.end - a.ts) / 1e3
    for row in by_kind.values():
        row["ms"] = r3(row["ms"])
    blocking = [rt for rt in runtime_prog if is_blocking_copy_api(rt.name) and w0 <= rt.ts < w1]
    # Pageable copies on the device that no compute hides: what pinned memory would overlap.
    compute = merge(r for k in att.kinds.values() for r in k.get("compute", []))
    pageable_r = intersect(merge_sorted((a.ts, a.end) for a in pageable), slots)
    pageable_exposed = total(pageable_r) - total(intersect(pageable_r, compute))
    idle_cost = m.roles_ms.get("copy", 0.0)
    m.values["memcpy"] = {
        "count": len(copies),
        "by_kind": by_kind,
        "pageable_count": len(pageable),
        "pageable_bytes": sum(a.nbytes for a in pageable),
        "pageable_ms": r3(sum(a.end - a.ts for a in pageable) / 1e3),
        "pageable_exposed_ms": r3(pageable_exposed / 1e3),
        "blocking_calls": len(blocking),
        "blocking_ms": r3(total(merge(span(ev) for ev in blocking)) / 1e3),
        "idle_cost_ms": r3(idle_cost),
        "share_pct": pct(idle_cost + pageable_exposed / 1e3, m.step_total_ms),
    }


def measure_communication(m, att: Attribution, slots, data, collective_ops: list[Event],
                   acts: list[Activity]) -> None:
    comm_ms = sum(total(intersect(k.get("comm", []), slots)) for k in att.kinds.values()) / 1e3
    exposed_all = att.total_us("communication") / 1e3
    overlap_ms = max(0.0, comm_ms - exposed_all)  # the rest ran beside compute
    step_total = m.step_total_ms
    exposed = m.roles_ms.get("communication", 0.0)
    host_coll = intersect(merge(span(ev) for ev in collective_ops), slots)
    n = max(1, len(m.details.get("primary_devices", [])))
    m.values["communication"] = {
        "kernel_ms": r3(comm_ms / n),
        "share_pct": pct(comm_ms / n, step_total),
        "exposed_ms": r3(exposed),
        "exposed_pct": pct(exposed, step_total),
        "overlap_pct": pct(overlap_ms, comm_ms),
        "collective_calls": len(collective_ops),
        "host_collective_ms": r3(total(host_coll) / 1e3),
        "backend": data.backend,
        "kernels": sorted({a.name for a in acts if a.kind == "comm"}, key=len)[:3],
    }


def measure_host_per_kernel(m, states, slots, kernels: dict) -> None:
    """Host time per launched kernel against GPU time per kernel: a host that spends more per
    kernel than the GPU does cannot keep the GPU fed, however long the kernels are."""
    launch_r = merge(r for st in states.values() for r in st.painted.get("launch", []))
    host_us = total(intersect(launch_r, slots))
    n = kernels["launches"] or kernels["count"]
    m.values["kernels"]["host_us_per_launch"] = r3(host_us / n) if n else 0.0
    m.values["kernels"]["gpu_us_per_kernel"] = (
        r3(kernels["busy_us_total"] / kernels["count"]) if kernels["count"] else 0.0
    )


def measure_allocator(m, data, runtime_prog, slots) -> None:
    """Allocator calls and the idle they cause, split into the first step (the caching
    allocator warming up) and the rest (churn)."""
    steps = m.steps
    w0, w1 = m.window
    calls = [rt for rt in runtime_prog if rt.name in ALLOC_APIS and w0 <= rt.ts < w1]
    att = m.attribution
    idle = att.ranges("allocator") if att else []
    n = max(1, len(m.details.get("primary_devices", [])))
    first = (steps[0].start, steps[0].end) if len(steps) > 1 else None
    first_idle = total(intersect(merge(idle), [first])) / n if first else 0.0
    later_idle = total(idle) / n - first_idle
    later_calls = [rt for rt in calls if not first or rt.ts >= first[1]]
    # Allocations concentrated in the first step and absent later are the cache warming up
    # (start-up); allocations in every step are churn.
    warmup = bool(first) and first_idle > 0 and later_idle < 0.1 * first_idle
    m.values["allocator"] = {
        "malloc_calls": sum(1 for rt in calls if "Free" not in rt.name),
        "free_calls": sum(1 for rt in calls if "Free" in rt.name),
        "time_ms": r3(total(merge(span(rt) for rt in calls)) / 1e3),
        "idle_cost_ms": r3(total(idle) / 1e3 / n),
        "first_step_idle_ms": r3(first_idle / 1e3),
        "steady_idle_ms": r3(later_idle / 1e3),
        "steady_calls": len(later_calls),
        "warmup_only": warmup,
        "steps": len(steps),
    }


def measure_startup(m: TraceMetrics, win) -> None:
    """Start-up inside the window (idle it causes), and, for a trace without steps, the
    start-up recorded before the window: such a trace is often a capture of the start itself
    (the first GPU work comes only after context creation or compilation)."""
    alloc = m.values["allocator"]
    cost = m.roles_ms.get("startup", 0.0)
    before = 0.0
    if win.source in ("recorded span", "device span") and win.before_us > 0:
        head = [(m.window[0] - win.before_us, m.window[0])]
        before = total(intersect(
            merge(r for st in m.states.values() for r in st.painted.get("startup", [])), head
        )) / 1e3
    m.values["startup"] = {
        "idle_cost_ms": r3(cost),
        "first_step_allocator_ms": alloc["first_step_idle_ms"] if alloc["warmup_only"] else 0.0,
        "before_window_ms": r3(before),
        "top": [[label, r3(ms)] for label, ms in m.top_labels("startup", 5)],
    }
    if before > 0:
        m.details["startup_before_labels"] = startup_before_labels(m, head)


def startup_before_labels(m: TraceMetrics, head) -> list[tuple[str, float]]:
    """The longest start-up activities before the window, by name."""
    sums: dict[str, float] = defaultdict(float)
    for st in m.states.values():
        for s, e in intersect(st.painted.get("startup", []), head):
            sums[st.label("startup", (s + e) / 2)] += (e - s) / 1e3
    return sorted(sums.items(), key=lambda kv: -kv[1])[:3]


def measure_long_gaps(m: TraceMetrics, att: Attribution, states) -> None:
    """Idle stretches of 500 ms or more (Nsight Systems' gpu_gaps), each with the cause that
    holds most of it and what the host was doing."""
    w0 = m.window[0]
    found = []
    for dev, idle in att.gaps.items():
        for g0, g1 in idle:
            if g1 - g0 >= LONG_GAP_US:
                found.append((dev, g0, g1))
    rows = []
    for dev, g0, g1 in sorted(found, key=lambda g: g[1] - g[2])[:20]:
        share = {}
        for cause in IDLE_CAUSES:
            got = total(intersect(att.roles.get(cause, {}).get(dev, []), [(g0, g1)]))
            if got > 0:
                share[cause] = got
        top = max(share, key=share.get) if share else "unprofiled"
        label = ""
        owners = [p for p in att.owners.get(top, []) if p[0] < g1 and p[1] > g0]
        if owners:
            s, e, tid = max(owners, key=lambda p: min(p[1], g1) - max(p[0], g0))
            st = states.get(tid)
            if st is not None:
                label = st.label(top, (max(s, g0) + min(e, g1)) / 2)
        rows.append({
            "device": dev,
            "start_ms": r3((g0 - w0) / 1e3),
            "dur_ms": r3((g1 - g0) / 1e3),
            "cause": top,
            "host": label,
        })
    gap_r = merge((g0, g1) for _, g0, g1 in found)
    m.values["gpu_gaps"] = {
        "threshold_ms": LONG_GAP_US / 1e3,
        "count": len(found),
        "total_ms": r3(total(gap_r) / 1e3),
        "longest_ms": r3(max((g1 - g0 for _, g0, g1 in found), default=0.0) / 1e3),
        "gaps": rows,
    }
    m.ranges["long_gaps"] = gap_r
