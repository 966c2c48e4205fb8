"""What every family of live rules shares: the thresholds and their reasons, small helpers over
a window of samples, and the checked readers of what an agent reports (untrusted numbers).

Thresholds, and why:
* NVML "utilization" is the share of the sample period in which the GPU was busy: on real
  hardware (H200, driver 580) a kernel *or a copy* counts, so a job that only copies over PCIe
  reads 52-100 %. It says whether the GPU did anything, not how much of it worked; GPM's SM
  activity (the share of SM-cycles with at least one warp resident, averaged over the SMs) says
  that. ``1 - utilization`` is the share of time the GPU had nothing at all to do.
* Every rule grades its cost the same way as the trace rules (the share of the time it costs):
  5 % is a warning, 25 % critical, so a live finding and a capture of the same job agree.
* A thread "has no slack" when it is on a CPU at least 80 % of the time (the agent's timing of
  the training thread, or the process's CPU % as one core's worth when no agent times it).
"""

from __future__ import annotations

import functools
import math
import shlex
from collections.abc import Iterable
from typing import Any

from gputop.core.model import GpuSample, ProcSample
from gputop.diagnostics import next_steps as ns
from gputop.diagnostics.findings import (  # noqa: F401  (the live rules read them here)
    CRITICAL_SHARE,
    WARNING_SHARE,
    severity_for,
)

WINDOW_S = 10.0  # most rules look at the last 10 s
# Rules need this many samples of a GPU (after its start-up) before they judge it.
MIN_SAMPLES = 3
# memory-growth fits a line to up to MEMORY_WINDOW_S of samples taken after the job's start-up
# (the caching allocator's first fill is over by its first step); it needs MEMORY_MIN_S of them,
# half the rules' window, to raise, and a rise that has held MEMORY_CRITICAL_S to be called
# critical.
MEMORY_MIN_S = 5.0
MEMORY_CRITICAL_S = 60.0
HUNG_S = 60.0
MEMORY_WINDOW_S = 300.0
KEEP_S = 330.0
# A thread on a CPU this share of the time (or a process at this % of one core) has no slack.
SATURATED = 0.8
# Utilization at or above this (percent) means the GPU did some work in the sample: NVML
# reports whole percents, and 0 is "nothing ran".
WORKED_UTIL = 1.0


def mean(values: Iterable[float | None]) -> float | None:
    """The mean of the known values (None and NaN left out), or None."""
    # statistics.fmean's own sum (fsum) without its overhead: rules call this ~100 times a
    # tick. ``v == v`` is False for NaN only.
    vals = [v for v in values if v is not None and v == v]
    return math.fsum(vals) / len(vals) if vals else None


def median(values: Iterable[float]) -> float:
    """``statistics.median`` (the mean of the two middle values of an even count) without
    loading ``statistics`` into the monitor (~0.1 MiB) for the ranks rule's few calls."""
    ordered = sorted(values)
    if not ordered:
        raise ValueError("median of no values")
    half = len(ordered) // 2
    return ordered[half] if len(ordered) % 2 else (ordered[half - 1] + ordered[half]) / 2


def gib(value: float) -> str:
    return f"{value / 1024**3:.1f} GiB"


def duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def pct(share: float) -> str:
    return f"{share * 100:.0f}%"


# -- what an agent reports: checked once, where it was read ------------------------------------


def agent_share(proc: ProcSample, name: str) -> float | None:
    """A 0-1 share the agent reported (``dataloader_wait_share``, ``sync_wait_share``,
    ``host_busy_share``), or None without an agent or that figure. Checked where it was read
    (core/agent_status.py)."""
    return getattr(proc.agent, name) if proc.agent is not None else None


def agent_steps(proc: ProcSample) -> int | None:
    """The optimizer steps the agent counted, or None without an agent (or a bad value)."""
    return proc.agent.steps if proc.agent is not None else None


# -- processes in a window ------------------------------------------------------------------------


def proc_series(gpus: list[GpuSample], pid: int) -> list[ProcSample]:
    return [p for g in gpus for p in g.processes if p.pid == pid]


def pids(gpus: list[GpuSample]) -> list[int]:
    return [p.pid for p in gpus[-1].processes if p.visible]


def first_pid(gpus: list[GpuSample]) -> int | None:
    found = pids(gpus) if gpus else []
    return found[0] if found else None


def look_deeper(gpus: list[GpuSample], pid: int | None, extra: str = "") -> str:
    """A command that runs as printed on the live process: a capture through its agent, else
    py-spy on its Python stacks (Nsight tools cannot attach to a running process)."""
    if pid is None:
        return "nvidia-smi --query-compute-apps=pid,used_memory --format=csv"
    procs = proc_series(gpus, pid)
    if procs and procs[-1].agent:
        return ns.gputop_capture(pid) + extra
    return ns.pyspy_dump(pid)


def relaunch(gpus: list[GpuSample], pid: int | None) -> str:
    """The process's own command line, to relaunch it under a profiler."""
    procs = proc_series(gpus, pid) if pid is not None else []
    cmdline = procs[-1].cmdline if procs else ""
    return app_of(cmdline) if cmdline else ns.APP


@functools.lru_cache(maxsize=256)
def app_of(cmdline: str) -> str:
    """The application part of a command line: a finding asks for it every tick."""
    try:
        words = shlex.split(cmdline)
    except ValueError:  # an unbalanced quote in what the process shows as its command
        words = cmdline.split()
    return ns.app_of(words)


def finite(value: Any) -> bool:
    return value is not None and value == value
