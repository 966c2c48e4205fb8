"""Traces of a GPU program whose GPU activity was not recorded.

A trace without kernel, copy or memset events is either a CPU job's (its operators are the
compute, ``trace_gaps.cpu_activities``) or a GPU job's whose device side is missing: recorded
with ``activities=[ProfilerActivity.CPU]``, stripped afterwards, or recorded with CUPTI's range
profiler, which replaces the kernel records by ranges of counters with no timing (Kineto's
``cuda_profiler_range``: the span split evenly between kernels). Judging the second kind with
the CPU model gives device verdicts about a device nobody measured, so the host alone is
assessed: what the training thread did, step by step.

What says a GPU program ran, in the order it is looked for: CUDA/HIP runtime calls, range
records of GPU work, the device properties the profiler wrote, allocator events on a CUDA/HIP
device, operators only a GPU runs (cuDNN, MIOpen, NCCL), and a NCCL process group.
"""

from __future__ import annotations

from collections import Counter

from gputop.diagnostics.trace.loading.load import TraceData
from gputop.diagnostics.trace.measuring.host import HOST_STATES, ThreadStates
from gputop.diagnostics.trace.measuring.intervals import Ranges, intersect, total
from gputop.diagnostics.trace.measuring.stats import pct, r3

# c10::DeviceType of the "[memory]" events: CUDA and HIP.
GPU_DEVICE_TYPES = (1, 6)
GPU_ONLY_OPS = ("aten::cudnn_", "aten::_cudnn_", "aten::miopen_", "aten::_miopen_", "nccl:")


def unrecorded_gpu(data: TraceData) -> str | None:
    """Why this trace with no GPU activity is a GPU program's, in words; None when nothing
    says so (a CPU job)."""
    if data.runtime:
        names = [name for name, _ in Counter(ev.name for ev in data.runtime).most_common(2)]
        return (f"{len(data.runtime):,} CUDA/HIP runtime calls ({', '.join(names)}) but no "
                "kernel, copy or memset events")
    ranges = [ev for ev in data.gpu_ranges if ev.cat == "cuda_profiler_range"]
    if ranges:
        return (f"kernels recorded only as {len(ranges):,} CUPTI range-profiler ranges "
                "(cuda_profiler_range: counters, no timing)")
    if data.gpu_ranges:
        return (f"{len(data.gpu_ranges):,} GPU-side annotation ranges (gpu_user_annotation) but "
                "no kernel events")
    if data.devices:
        return f"the profiler names the device {data.devices[0].name!r} but recorded no GPU work"
    if any(ev.args is not None and ev.args.device_type in GPU_DEVICE_TYPES
           for ev in data.memory):
        return "GPU memory allocations recorded, but no GPU work"
    ops = [ev.name for ev in data.cpu_ops if ev.name.startswith(GPU_ONLY_OPS)]
    if ops:
        return f"operators only a GPU runs ({ops[0]}) but no GPU activity"
    if (data.backend or "").lower() == "nccl":
        return "a NCCL process group but no GPU activity"
    return None


def host_breakdown(states: dict[object, ThreadStates], tid: object, slots: Ranges,
                   steps) -> dict:
    """The training thread's time by state over the window and per step: what a host-only
    assessment can say (``measuring/host.py``'s states: DataLoader, sync, launch path, host work...)."""
    st = states.get(tid) or ThreadStates(tid)
    window_ms = total(slots) / 1e3

    def split(ranges: Ranges) -> dict[str, float]:
        parts = st.split(ranges)
        return {state: total(parts.get(state, [])) / 1e3 for state in HOST_STATES}

    ms = split(slots)
    return {
        "thread": str(tid),
        "ms": {state: r3(x) for state, x in ms.items()},
        "pct": {state: pct(x, window_ms) for state, x in ms.items()},
        "per_step_ms": [
            {state: r3(x) for state, x in split(intersect(slots, [(s.start, s.end)])).items()}
            for s in steps
        ],
    }
