"""Descriptive statistics of a trace: kernels, top operators, memory.

These describe the work; the attribution (``measuring/gaps.py``) explains the idle time.
"""

from __future__ import annotations

import statistics
from collections import Counter, defaultdict
from collections.abc import Iterable

from gputop.diagnostics.trace.loading.load import Event, TraceData
from gputop.diagnostics.trace.measuring.gaps import Activity, Launch
from gputop.diagnostics.trace.measuring.intervals import Ranges
from gputop.diagnostics.trace.measuring.kernels import DATALOADER_PREFIX, kernel_class

# A kernel this short finishes before a typical launch call returns (CUDA launch overhead is
# ~5-10 us on current drivers); "under 10 us" is also TraceLens' and HTA's short-kernel bucket.
SHORT_KERNEL_US = 10.0


def r3(x: float, nd: int = 3) -> float:
    return round(float(x), nd)


def pct(part: float, whole: float) -> float:
    return round(100.0 * part / whole, 2) if whole > 0 else 0.0


def percentile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return 0.0
    k = (len(sorted_values) - 1) * q
    lo = int(k)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (k - lo)


def kernel_stats(
    acts: list[Activity],
    launches: dict[int, Launch],
    window: tuple[float, float],
    n_steps: int,
    launch_calls: int,
    data: TraceData,
    limit: int = 10,
) -> tuple[dict, dict, list[dict], str | None]:
    """(kernels, tensor_cores, top_kernels, top kernel run without tensor cores), in one pass
    over the kernels that start inside the window."""
    w0, w1 = window
    durs: list[float] = []
    launch_durs: list[float] = []
    shorter = 0
    matrix_us = {"tensor": 0.0, "simt": 0.0, "unknown": 0.0}
    compute_us = 0.0
    simt: dict[str, float] = defaultdict(float)
    per_name: dict[str, float] = defaultdict(float)
    calls: Counter = Counter()
    for a in acts:
        kind = a.kind
        if (kind != "compute" and kind != "comm") or not (w0 <= a.ts < w1):
            continue
        d = a.end - a.ts
        durs.append(d)
        per_name[a.name] += d
        calls[a.name] += 1
        rt = launches.get(a.correlation) if a.correlation is not None else None
        if rt is not None:
            launch_durs.append(rt.end - rt.ts)
            if d < rt.end - rt.ts:
                shorter += 1
        if kind == "compute":
            compute_us += d
            _, is_matrix, precision = kernel_class(a.name)
            if is_matrix:
                matrix_us[precision] += d
                if precision == "simt":
                    simt[a.name] += d
    durs.sort()
    launch_durs.sort()
    window_s = (w1 - w0) / 1e6
    kernels = {
        "count": len(durs),
        "launches": launch_calls,
        "launch_rate_per_s": round(launch_calls / window_s, 1) if window_s > 0 else 0.0,
        "launches_per_step": round(launch_calls / n_steps, 1) if n_steps else 0.0,
        "duration_us": {
            "p50": r3(percentile(durs, 0.5)),
            "p90": r3(percentile(durs, 0.9)),
            "p99": r3(percentile(durs, 0.99)),
            "mean": r3(statistics.fmean(durs)) if durs else 0.0,
        },
        "busy_us_total": r3(sum(durs)),
        "launch_call_us_p50": r3(percentile(launch_durs, 0.5)),
        # HTA's "short kernel": it runs for less time than the CPU took to launch it.
        "shorter_than_launch_pct": pct(shorter, len(launch_durs)),
        "under_10us_pct": pct(sum(1 for d in durs if d < SHORT_KERNEL_US), len(durs)),
    }
    dev = data.devices[0] if data.devices else None
    cc = f"{dev.compute_major}.{dev.compute_minor}" if dev and dev.compute_major is not None else None
    all_matrix = sum(matrix_us.values())
    known = matrix_us["tensor"] + matrix_us["simt"]
    tensor_cores = {
        "compute_capability": cc,
        "matrix_kernel_ms": r3(all_matrix / 1e3),
        "matrix_share_of_kernel_pct": pct(all_matrix, compute_us),
        "tensor_core_kernel_ms": r3(matrix_us["tensor"] / 1e3),
        "simt_kernel_ms": r3(matrix_us["simt"] / 1e3),
        "unknown_kernel_ms": r3(matrix_us["unknown"] / 1e3),
        # Of the matrix time whose precision the kernel names tell.
        "tensor_core_share_of_matrix_pct": pct(matrix_us["tensor"], known),
    }
    all_us = sum(per_name.values())
    top = [
        {"name": name, "ms": r3(t / 1e3), "calls": calls[name], "pct": pct(t, all_us),
         "class": _class_name(name)}
        for name, t in sorted(per_name.items(), key=lambda kv: -kv[1])[:limit]
    ]
    return kernels, tensor_cores, top, (max(simt, key=simt.get) if simt else None)


def _class_name(name: str) -> str:
    comm, matrix, precision = kernel_class(name)
    if comm:
        return "communication"
    if matrix:
        return {"tensor": "matrix (tensor cores)", "simt": "matrix (fp32, no tensor cores)",
                "unknown": "matrix (precision unknown)"}[precision]
    return "other"


def walk_host_ops(
    ops_by_thread: Iterable[list[Event]], w0: float, w1: float, limit: int = 10
) -> tuple[Ranges, list[dict]]:
    """One walk over the host operators, per thread in start order (each list sorted by
    (start, -duration)): the union of their spans (per thread, then merged) and the top
    operators by self time (duration minus the time in child operators; operators nest per
    thread)."""
    busy: Ranges = []
    self_us: dict[str, float] = defaultdict(float)
    calls: Counter = Counter()

    for evs in ops_by_thread:
        stack: list[list] = []  # [end, name, child_us, dur, counted]
        cur_s = cur_e = None
        for ev in evs:
            ts, dur = ev.ts, ev.dur
            end = ts + dur
            if cur_e is not None and ts <= cur_e:
                if end > cur_e:
                    cur_e = end
            else:
                if cur_e is not None:
                    busy.append((cur_s, cur_e))
                cur_s, cur_e = ts, end
            while stack and stack[-1][0] <= ts:
                _end, name, child, pdur, counted = stack.pop()
                if counted:
                    self_us[name] += pdur - child if pdur > child else 0.0
                    calls[name] += 1
            if stack:
                stack[-1][2] += dur
            counted = (
                (ev.cat == "cpu_op" or ev.cat == "Operator")
                and w0 <= ts < w1
                and not ev.name.startswith(DATALOADER_PREFIX)
            )
            stack.append([end, ev.name, 0.0, dur, counted])
        for _end, name, child, pdur, counted in stack:
            if counted:
                self_us[name] += pdur - child if pdur > child else 0.0
                calls[name] += 1
        if cur_e is not None and cur_e > cur_s:
            busy.append((cur_s, cur_e))
    rows = sorted(self_us.items(), key=lambda kv: -kv[1])[:limit]
    top = [{"name": n, "self_ms": r3(t / 1e3), "calls": calls[n]} for n, t in rows]
    return busy, top


def memory(data: TraceData) -> dict:
    """Peak device memory from "[memory]" events: their "Total Allocated" when recorded, else
    the peak of the running sum of allocation deltas (a rise within the trace, a lower bound)."""
    if not data.memory:
        return {"present": False}
    peaks: dict[str, float] = {}
    running: dict[str, float] = defaultdict(float)
    rises: dict[str, float] = {}
    for ev in sorted(data.memory, key=lambda e: e.ts):
        args = ev.args
        if args is None or args.device_type in (None, 0):  # 0 = CPU memory
            continue
        key = str(args.device_id if args.device_id is not None else 0)
        if args.total_allocated is not None:
            if args.total_allocated > peaks.get(key, -1):
                peaks[key] = args.total_allocated
        elif args.alloc_bytes is not None:
            running[key] += args.alloc_bytes
            if running[key] > rises.get(key, 0):
                rises[key] = running[key]
    caps = {str(d.index): d.total_memory for d in data.devices if d.total_memory}
    out: dict = {"present": True}
    if peaks:
        out["peak_allocated_bytes"] = {k: int(x) for k, x in peaks.items()}
        out["capacity_bytes"] = {k: caps[k] for k in peaks if k in caps}
        out["peak_pct_of_capacity"] = {k: pct(peaks[k], caps[k]) for k in peaks if k in caps}
    elif rises:
        out["peak_rise_bytes"] = {k: int(x) for k, x in rises.items()}
    return out
