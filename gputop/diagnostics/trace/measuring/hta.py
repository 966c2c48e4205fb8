"""Holistic Trace Analysis' temporal breakdown and idle split, computed the way HTA does.

Kept apart from gputop's own attribution so the two can be compared side by side
(``benchmarks/bench_analyze.py``): over the span from the first to the last GPU activity the
steps launched, idle = span - union of GPU activity (kernels, copies, memsets and, as HTA counts
them, sync waits drawn on a stream; "memcpy_pct" is everything that is neither compute nor
communication); each gap between activities on a stream is host-wait when the launch of the next
activity started after the previous one ended, kernel-wait when shorter than 30 ns, else other.
"""

from __future__ import annotations

from gputop.diagnostics.trace.measuring.gaps import Activity, Launch
from gputop.diagnostics.trace.measuring.intervals import Ranges, intersect, merge_sorted, total

# HTA's default ``consecutive_kernel_delay``: gaps shorter than this are the GPU's own
# back-to-back launch latency, not the host's fault.
KERNEL_WAIT_US = 0.03


def _pct(part: float, whole: float) -> float:
    return round(100.0 * part / whole, 2) if whole > 0 else 0.0


def _r(x: float, nd: int = 3) -> float:
    return round(float(x), nd)


def _extend(u: list, start: float, end: float) -> None:
    """Add [start, end] to the running union ``u`` = [open start, open end, closed total];
    intervals must come in start order."""
    if end <= start:
        return
    if u[1] is not None and start <= u[1]:
        if end > u[1]:
            u[1] = end
    else:
        if u[1] is not None:
            u[2] += u[1] - u[0]
        u[0], u[1] = start, end


def _union_total(u: list) -> float:
    return u[2] + (u[1] - u[0] if u[1] is not None else 0.0)


def temporal_breakdown(
    values: dict,
    launched: list[Activity],
    rt_by_corr: dict[int, Launch],
    gpu_busy_r: Ranges,
    acts: list[Activity],
    step_slots: Ranges,
) -> None:
    # One pass over the activities (sorted by start): running unions per device (all, compute,
    # compute+communication) and per stream, and HTA's idle split between a stream's activities.
    devices: dict[int, dict] = {}
    streams: dict[tuple[int, int], list] = {}  # [open start, open end, total, prev end]
    host_wait = kernel_wait = other = 0.0
    for a in launched:
        ts, end, kind = a.ts, a.end, a.kind
        d = devices.get(a.device)
        if d is None:
            d = devices[a.device] = {
                "first": ts,
                "last": end,
                "all": [None, None, 0.0],
                "compute": [None, None, 0.0],
                "cc": [None, None, 0.0],
            }
        elif end > d["last"]:
            d["last"] = end
        _extend(d["all"], ts, end)
        if kind == "compute":
            _extend(d["compute"], ts, end)
            _extend(d["cc"], ts, end)
        elif kind == "comm":
            _extend(d["cc"], ts, end)
        if kind == "sync":
            continue  # HTA's idle split looks at kernels, copies and memsets only
        st = streams.get((a.device, a.stream))
        if st is None:
            st = streams[(a.device, a.stream)] = [None, None, 0.0, None]
        prev_end = st[3]
        if prev_end is not None and ts > prev_end:
            gap = ts - prev_end
            rt = rt_by_corr.get(a.correlation) if a.correlation is not None else None
            if rt is not None and rt.ts > prev_end:
                host_wait += gap
            elif gap < KERNEL_WAIT_US:
                kernel_wait += gap
            else:
                other += gap
        if prev_end is None or end > prev_end:
            st[3] = end
        _extend(st, ts, end)

    span_sum = compute_sum = comm_sum = busy_sum = 0.0
    slots_total = total(step_slots)
    for dev, d in sorted(devices.items()):
        d_span = d["last"] - d["first"]
        busy, comp, cc = (_union_total(d[k]) for k in ("all", "compute", "cc"))
        span_sum += d_span
        busy_sum += busy
        compute_sum += comp
        comm_sum += cc - comp
        if len(devices) == 1:
            dev_busy = gpu_busy_r
        else:
            dev_busy = merge_sorted((a.ts, a.end) for a in acts if a.device == dev)
        values["gpu"]["per_device"][str(dev)] = {
            "busy_pct_of_steps": _pct(total(intersect(dev_busy, step_slots)), slots_total),
            "busy_pct_of_span": _pct(busy, d_span),
            "streams_busy_pct_of_span": {
                str(stream): _pct(_union_total(u), d_span)
                for (sdev, stream), u in sorted(streams.items())
                if sdev == dev
            },
        }
    values["temporal"] = {
        "span_ms": _r(span_sum / 1e3),
        "compute_pct": _pct(compute_sum, span_sum),
        "communication_pct": _pct(comm_sum, span_sum),
        "memcpy_pct": _pct(busy_sum - compute_sum - comm_sum, span_sum),
        "idle_pct": _pct(span_sum - busy_sum, span_sum),
    }
    idle_total = host_wait + kernel_wait + other
    values["idle_split"] = {
        "host_wait_ms": _r(host_wait / 1e3),
        "kernel_wait_ms": _r(kernel_wait / 1e3),
        "other_ms": _r(other / 1e3),
        "host_wait_pct": _pct(host_wait, idle_total),
        "kernel_wait_pct": _pct(kernel_wait, idle_total),
        "other_pct": _pct(other, idle_total),
    }


def stream_sync_activities(gpu_syncs: list) -> list[Activity]:
    """Device-side sync waits drawn on a stream (``cuda_sync`` events), which HTA counts as GPU
    activity; waits not tied to a stream (event/context syncs) are host-side only."""
    from gputop.diagnostics.trace.measuring.gaps import as_int

    out = []
    for ev in gpu_syncs:
        args = ev.args
        if args is None or not isinstance(args.stream, int) or args.stream < 0:
            continue
        corr = args.correlation if isinstance(args.correlation, int) else None
        device = as_int(args.device if args.device is not None else ev.pid)
        out.append(Activity(ev.ts, ev.ts + ev.dur, "sync", device, args.stream, ev.name, corr, 0))
    return out
