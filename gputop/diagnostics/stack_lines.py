"""The Python source lines behind a trace's top host costs, from the ``python_function`` events
that torch.profiler writes when it records stacks (``with_stack=True``; `gputop capture` and
`p` ask for them).

For each kind of host time that costs the step (the DataLoader's ``__next__``, host syncs
such as ``.item()``, the optimizer step; else the whole step), the Python frames that spent
the most *self* time inside those spans, on the same thread: ``train.py(48): decode_sample``.
A frame's self time is its time minus that of the Python frames it called; calls into C
(``<built-in method ...>``) count as the caller's, so the line that called an expensive
builtin or operator is the one named. So do frames of the Python standard library and of torch
when a frame of the user's code called them: a training loop that waits for DataLoader
workers spends its time in ``selectors.py``, under torch's DataLoader, and the line to name
is the user's loop (``train.py(40): main``) that asked for the batch; a stack with no frame of
the user's keeps its innermost frame.

Independent of the trace metrics: only the public loader (``trace_load.load_trace``) is used,
with the same limits, and any shape it did not foresee yields no lines rather than an error.
"""

from __future__ import annotations

import functools
import os
import re
import sysconfig
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

from gputop.diagnostics.trace.loading.load import DEFAULT_LIMITS, LoadLimits, TraceError, load_trace

MIN_SHARE_OF_STEPS = 0.05  # a kind of host time that costs under 5 % of the steps is not named
FRAMES_PER_COST = 3
# Frames that only wrap others: the profiler's own, and C calls (their time is the caller's).
_WRAPPERS = re.compile(r"^<built-in|^torch/profiler/|^torch/autograd/profiler|"
                       r"(^|/)gputop/agent/|(^|/)gputop/core/protocol\.py|^<frozen ")

Ranges = list[tuple[float, float]]
_STDLIB = sysconfig.get_paths()["stdlib"]
_FILE = re.compile(r"^(.+)\(\d+\): ")  # "selectors.py(402): select" -> selectors.py


@functools.lru_cache(maxsize=4096)
def _library(frame: str) -> bool:
    """Whether ``frame`` runs code of the standard library or of torch, not the user's. The
    profiler names files relative to the sys.path entry they were found under (torch/...,
    multiprocessing/connection.py); a relative name is the standard library's when that file
    is in this Python's."""
    found = _FILE.match(frame)
    if found is None:
        return False
    file = found.group(1)
    if file.startswith("torch/") or "/site-packages/torch/" in file:
        return True
    if os.path.isabs(file):
        return file.startswith(_STDLIB + os.sep) and "-packages" not in file
    return os.path.isfile(os.path.join(_STDLIB, file))


@dataclass(frozen=True)
class SourceLine:
    frame: str  # as the trace names it: "train.py(48): decode_sample"
    self_ms: float
    share: float  # of the cost's time, 0-1

    def to_json(self) -> dict:
        return {"frame": self.frame, "self_ms": round(self.self_ms, 3),
                "share": round(self.share, 4)}


@dataclass(frozen=True)
class CostLines:
    cost: str  # "DataLoader", "host sync", "optimizer step", "step"
    total_ms: float
    lines: tuple[SourceLine, ...]

    def to_json(self) -> dict:
        return {"cost": self.cost, "total_ms": round(self.total_ms, 3),
                "lines": [line.to_json() for line in self.lines]}


def _cost_kind(name: str) -> str | None:
    if name.startswith("enumerate(DataLoader)"):
        return "DataLoader"
    if name in ("aten::item", "aten::_local_scalar_dense") or name.endswith("Synchronize"):
        return "host sync"
    if name.startswith("Optimizer.step#"):
        return "optimizer step"
    return None


def _merge(spans: Iterable[tuple[float, float]]) -> Ranges:
    out: Ranges = []
    for start, end in sorted(spans):
        if out and start <= out[-1][1]:
            if end > out[-1][1]:
                out[-1] = (out[-1][0], end)
        else:
            out.append((start, end))
    return out


def _intersect(a: Ranges, b: Ranges) -> Ranges:
    out: Ranges = []
    i = j = 0
    while i < len(a) and j < len(b):
        start, end = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if start < end:
            out.append((start, end))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def _self_segments(events: list) -> list[tuple[float, float, str]]:
    """(start, end, frame) pieces of time in which ``frame`` was the innermost frame (of the
    user's code, see ``_library``); events of one thread. A child that outlives its parent
    (a broken writer) is cut at the parent's end."""
    segments: list[tuple[float, float, str]] = []
    stack: list[tuple[float, str]] = []  # (end, the frame its time counts to)
    cursor = 0.0
    for ev in sorted(events, key=lambda e: (e.ts, -e.dur)):
        start, end = ev.ts, ev.ts + ev.dur
        while stack and stack[-1][0] <= start:
            top_end, name = stack.pop()
            if top_end > cursor:
                segments.append((cursor, top_end, name))
            cursor = max(cursor, top_end)
        owner = ev.name
        if stack:
            if start > cursor:
                segments.append((cursor, start, stack[-1][1]))
            end = min(end, stack[-1][0])
            if _library(ev.name) and not _library(stack[-1][1]):
                owner = stack[-1][1]  # the user's frame that called into the library
        cursor = max(cursor, start)
        stack.append((end, owner))
    while stack:
        top_end, name = stack.pop()
        if top_end > cursor:
            segments.append((cursor, top_end, name))
        cursor = max(cursor, top_end)
    return segments


def _self_time_inside(segments: list[tuple[float, float, str]], ranges: Ranges
                      ) -> dict[str, float]:
    """Per frame, the part of its self time that falls inside ``ranges`` (both sorted)."""
    out: dict[str, float] = defaultdict(float)
    i = 0
    for start, end, name in segments:
        while i < len(ranges) and ranges[i][1] <= start:
            i += 1
        j = i
        while j < len(ranges) and ranges[j][0] < end:
            overlap = min(end, ranges[j][1]) - max(start, ranges[j][0])
            if overlap > 0:
                out[name] += overlap
            j += 1
    return out


def top_source_lines(path: str, limits: LoadLimits = DEFAULT_LIMITS,
                     per_cost: int = FRAMES_PER_COST) -> list[CostLines]:
    """The source lines of the top host costs of the trace at ``path``; empty when the trace
    has no Python stacks or cannot be read (the analysis reports that on its own)."""
    try:
        data = load_trace(path, limits)
    except TraceError:
        return []
    try:
        return _source_lines(data, per_cost)
    except (AttributeError, TypeError, ValueError):
        return []  # a shape nobody foresaw: no lines, never an error


def _source_lines(data, per_cost: int) -> list[CostLines]:
    python_by_tid: dict[object, list] = defaultdict(list)
    for ev in data.python:
        if ev.dur > 0 and not _WRAPPERS.search(ev.name):
            python_by_tid[ev.tid].append(ev)
    if not python_by_tid:
        return []
    spans: dict[str, dict[object, list[tuple[float, float]]]] = defaultdict(
        lambda: defaultdict(list))
    for ev in [*data.cpu_ops, *data.runtime]:
        kind = _cost_kind(ev.name)
        if kind is not None and ev.dur > 0:
            spans[kind][ev.tid].append((ev.ts, ev.ts + ev.dur))
    for ev in data.steps:
        spans["step"][ev.tid].append((ev.ts, ev.ts + ev.dur))
    if not spans["step"]:  # no ProfilerStep: the whole recorded time of each thread
        for tid, events in python_by_tid.items():
            spans["step"][tid].append((min(e.ts for e in events),
                                       max(e.ts + e.dur for e in events)))
    merged = {kind: {tid: _merge(s) for tid, s in by_tid.items()}
              for kind, by_tid in spans.items()}
    if data.steps:
        # Only what happens inside the steps: an optimizer step's span also holds the
        # profiler stopping (the capture ends in a step hook), which is not the job's cost.
        steps = _merge((ev.ts, ev.ts + ev.dur) for ev in data.steps)
        for kind, by_tid in merged.items():
            if kind != "step":
                merged[kind] = {tid: _intersect(r, steps) for tid, r in by_tid.items()}
    totals = {kind: sum(b - a for ranges in by_tid.values() for a, b in ranges)
              for kind, by_tid in merged.items()}
    steps_total = totals.get("step", 0.0)
    chosen = [kind for kind in sorted(totals, key=lambda k: -totals[k])
              if kind != "step" and totals[kind] >= MIN_SHARE_OF_STEPS * steps_total]
    segments = {tid: _self_segments(events) for tid, events in python_by_tid.items()}
    out = []
    for kind in (chosen or ["step"])[:2]:
        self_time: dict[str, float] = defaultdict(float)
        for tid, ranges in merged[kind].items():
            for name, us in _self_time_inside(segments.get(tid, []), ranges).items():
                self_time[name] += us
        total = totals[kind]
        if total <= 0 or not self_time:
            continue
        top = sorted(self_time.items(), key=lambda kv: (-kv[1], kv[0]))[:per_cost]
        out.append(CostLines(kind, total / 1000.0,
                             tuple(SourceLine(name, us / 1000.0, us / total)
                                   for name, us in top)))
    return out


def format_source_lines(costs: list[CostLines]) -> str:
    """The report's section; empty when there is nothing to say."""
    if not costs:
        return ""
    from gputop.core.format import safe_text

    lines = ["Source lines of the top host costs (Python stacks, self time)"]
    for cost in costs:
        lines.append(f"  {cost.cost} ({cost.total_ms:.1f} ms):")
        for line in cost.lines:
            lines.append(safe_text(f"    {line.share * 100:5.1f} %  {line.self_ms:8.1f} ms  "
                                   f"{line.frame}"))
    return "\n".join(lines)
