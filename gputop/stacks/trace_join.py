"""Where in the code a capture's time went, without the profiler's Python tracer: py-spy's
samples of the capture window (``timeline``) joined to the trace's steps and idle intervals.

The agent says when each recorded step began on the wall clock (``walls``), and which thread
trains; the trace has the same steps (``ProfilerStep#N``), which places trace time on the wall
clock. Each finding that costs idle time (``dataloader-stall``, ``host-sync``, ``gpu-idle``,
...) owns intervals of the attribution (``measuring/gaps.py``); the samples that fall in them say what
the training thread was doing there, and, when it only waited in library code (a DataLoader
queue), what the DataLoader workers were doing meanwhile. A sample is named by its innermost
frame in the user's own code (not site-packages or the standard library), with the user frame
that library code called into (``__getitem__``) and the library frame it sits in when that is
where it waits.

Pure: dataclasses in, dataclasses out; the finding's ``where`` line is set from the result.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections import defaultdict
from dataclasses import dataclass

from gputop.diagnostics.trace.measuring.intervals import Ranges, intersect, merge, subtract, total
from gputop.stacks.profile import Frame
from gputop.stacks.timeline import Sample, Timeline

# Finding id -> the idle causes of the attribution whose time it costs.
CAUSES = {
    "dataloader-stall": ("dataloader",),
    "host-sync": ("sync",),
    "launch-bound": ("launch",),
    "allocator-churn": ("allocator",),
    "cold-start": ("startup",),
    "pageable-memcpy": ("copy",),
    "gpu-idle": ("host", "unprofiled"),
    "long-gpu-gaps": ("host", "unprofiled"),
}
TOP = 3
# Workers are named for a finding when the training thread spent at least this share of its
# time there waiting in library code, and the workers ran user code at least this much.
WAITING_SHARE = 0.5
_AGENT = ("/gputop/agent/", "/gputop/protocol.py", "/gputop/_boot/")  # the agent's own code
# The loop a DataLoader worker runs (torch/utils/data/_utils/worker.py): a forked worker's
# stack still holds the parent's frames down to the fork (the training loop's `for batch in
# loader`); only the frames inside this loop are the worker's own work.
WORKER_LOOP = "_worker_loop"


def _is_user(frame: Frame) -> bool:
    return not frame.is_library and not any(part in frame.file for part in _AGENT) \
        and not frame.file.startswith("<")


@dataclass(frozen=True)
class WhereLine:
    frame: Frame  # the innermost frame in the user's code
    via: Frame | None  # the user frame that library code called into, when another one
    waiting_in: Frame | None  # the innermost (library) frame, when the thread sat there
    who: str  # "training thread" | "DataLoader workers"
    ms: float
    share: float  # of the finding's time

    def text(self) -> str:
        out = f"{self.frame.location()} {self.frame.function}"
        if self.via is not None:
            out += f" (in {self.via.function}, {self.via.location()})"
        if self.waiting_in is not None:
            out += f", waiting in {self.waiting_in.location()} {self.waiting_in.function}"
        return out

    def to_json(self) -> dict:
        return {"frame": f"{self.frame.location()} {self.frame.function}",
                "function": self.frame.function, "file": self.frame.file,
                "line": self.frame.line, "self_ms": round(self.ms, 3),
                "share": round(self.share, 4), "who": self.who,
                "via": self.via.to_json() if self.via else None,
                "waiting_in": self.waiting_in.to_json() if self.waiting_in else None}


@dataclass(frozen=True)
class FindingWhere:
    finding: str  # the finding id ("step" for the steps as a whole)
    total_ms: float  # the finding's time in the capture
    covered_ms: float  # of it, the time py-spy sampled
    lines: tuple[WhereLine, ...]
    where: str | None  # the one line for the finding
    # The user function library code called into, its lines together (``__getitem__``), when
    # it holds more than the top line.
    entry: WhereLine | None = None

    def to_json(self) -> dict:
        return {"cost": self.finding, "from": "py-spy", "total_ms": round(self.total_ms, 3),
                "sampled_ms": round(self.covered_ms, 3),
                "entry": self.entry.to_json() if self.entry else None,
                "where": self.where, "lines": [line.to_json() for line in self.lines]}


def trace_to_wall(tm, walls: list[float]) -> float | None:
    """Seconds to add to a trace time (in seconds) to get the wall clock, from the recorded
    steps' start times (or, for a time window, the start of what was recorded)."""
    if not walls:
        return None
    starts = sorted(s.host_start for s in tm.steps) if tm.step_source == "ProfilerStep" else []
    if starts:
        pairs = list(zip(starts, walls))
        return statistics.median(w - s / 1e6 for s, w in pairs)
    window = tm.values.get("window", {})
    start = window.get("start_us")
    if start is None:
        return None
    return walls[0] - (start - 1e3 * (window.get("left_out_before_ms") or 0.0)) / 1e6


def _finding_ranges(tm, finding_id: str) -> Ranges:
    att = tm.attribution
    if att is None:
        return []
    spans = merge(r for cause in CAUSES[finding_id] for r in att.ranges(cause))
    long_gaps = tm.ranges.get("long_gaps", [])
    if finding_id == "long-gpu-gaps":
        return intersect(spans, long_gaps)
    if finding_id == "gpu-idle" and long_gaps:
        return subtract(spans, long_gaps)
    return spans


def _overlap(samples: list[Sample], ranges: Ranges) -> list[tuple[Sample, float]]:
    """Each sample (sorted by time) with the seconds of it inside ``ranges`` (sorted)."""
    out = []
    j = 0
    for s in samples:
        start, end = s.t, s.t + s.dur
        while j < len(ranges) and ranges[j][1] <= start:
            j += 1
        k, inside = j, 0.0
        while k < len(ranges) and ranges[k][0] < end:
            inside += min(end, ranges[k][1]) - max(start, ranges[k][0])
            k += 1
        if inside > 0:
            out.append((s, inside))
    return out


def _name(frames: tuple[Frame, ...]) -> tuple[Frame, Frame | None, Frame | None] | None:
    """(innermost user frame, the user frame library code called into, the innermost frame
    when it is library code), or None when no frame is the user's."""
    users = [i for i, f in enumerate(frames) if _is_user(f)]
    if not users:
        return None
    inner = users[-1]
    entry = inner
    while entry > 0 and _is_user(frames[entry - 1]):
        entry -= 1
    via = frames[entry] if entry != inner and entry > 0 else None
    waiting = frames[-1] if inner != len(frames) - 1 else None
    return frames[inner], via, waiting


def _worker_own(sample: Sample) -> Sample:
    """A worker's sample from its loop inward: waiting for the next index (no user frame
    inside the loop) is not time in the user's code, however long the parent's frames under
    it are."""
    frames = sample.frames
    loops = [i for i, f in enumerate(frames) if f.function == WORKER_LOOP and f.is_library]
    return dataclasses.replace(sample, frames=frames[loops[-1] + 1:]) if loops else sample


def _lines(weighted: list[tuple[Sample, float]], who: str, total_s: float
           ) -> tuple[list[WhereLine], float, WhereLine | None]:
    """The top lines of these samples, the share of ``total_s`` spent in library code, and
    the user function that library code called into most (``__getitem__``: its lines
    together), when it holds more than the top line alone."""
    by: dict[tuple, float] = defaultdict(float)
    entries: dict[Frame, float] = defaultdict(float)
    waiting = 0.0
    for s, seconds in weighted:
        named = _name(s.frames)
        if named is None:
            continue
        by[named] += seconds
        if named[1] is not None:
            entries[named[1]] += seconds
        if named[2] is not None:
            waiting += seconds
    share = (lambda seconds: seconds / total_s) if total_s else (lambda seconds: 0.0)
    top = sorted(by.items(), key=lambda kv: (-kv[1], kv[0][0].location()))[:TOP]
    lines = [WhereLine(f, via, wait, who, seconds * 1e3, share(seconds))
             for (f, via, wait), seconds in top]
    entry = None
    if entries and lines:
        frame, seconds = max(entries.items(), key=lambda kv: (kv[1], kv[0].location()))
        if seconds > lines[0].ms / 1e3 * 1.2:
            entry = WhereLine(frame, None, None, who, seconds * 1e3, share(seconds))
    return lines, (waiting / total_s if total_s else 0.0), entry


def join(analysis, timeline: Timeline, walls: list[float], pid: int,
         train_thread: int | None) -> list[FindingWhere]:
    """Where the time of each finding of ``analysis`` went (those with idle causes; else the
    steps as a whole)."""
    tm = analysis.details
    if tm is None or not timeline.samples:
        return []
    offset = trace_to_wall(tm, walls)
    if offset is None:
        return []
    main = [s for s in timeline.samples if s.pid == pid
            and (train_thread is None or s.tid == train_thread)]
    workers = [_worker_own(s) for s in timeline.samples if s.pid != pid]
    sampled = [(timeline.start, timeline.end)]
    out = []
    wanted = [f.id for f in analysis.findings if f.id in CAUSES and f.severity != "info"]
    for finding_id in dict.fromkeys(wanted):
        out.append(_one(finding_id, _finding_ranges(tm, finding_id), offset, main, workers,
                        sampled))
    if not out:  # nothing idle to explain: where the steps went
        steps = merge((s.host_start, s.host_end) for s in tm.steps) or [tm.window]
        out.append(_one("step", steps, offset, main, workers, sampled))
    return [w for w in out if w.lines]


def _one(finding_id: str, trace_ranges: Ranges, offset: float, main: list[Sample],
         workers: list[Sample], sampled: Ranges) -> FindingWhere:
    wall = [(a / 1e6 + offset, b / 1e6 + offset) for a, b in trace_ranges]
    covered = intersect(wall, sampled)
    total_s, covered_s = total(wall), total(covered)
    lines, waiting, entry = _lines(_overlap(main, covered), "training thread", covered_s)
    where_lines = list(lines)
    if waiting >= WAITING_SHARE and workers:
        # Several workers run at once: their shares are of their own time in user code.
        weighted = [(s, sec) for s, sec in _overlap(workers, covered) if _name(s.frames)]
        worker_lines, _, worker_entry = _lines(weighted, "DataLoader workers",
                                               sum(sec for _, sec in weighted))
        if worker_lines:
            lines = [*worker_lines, *lines]
            where_lines, entry = worker_lines, worker_entry
    where = None
    if where_lines:
        top = where_lines[0]
        of = ("the workers' time in your code meanwhile" if top.who == "DataLoader workers"
              else "the step time" if finding_id == "step" else "the time it costs")
        if entry is not None:
            where = (f"{entry.frame.function} ({entry.frame.location()}): {entry.who}, "
                     f"{entry.share * 100:.0f} % of {of}; hottest line {top.frame.location()} "
                     f"{top.frame.function} ({top.share * 100:.0f} %) (py-spy)")
        else:
            where = (f"{top.text()}: {top.who}, {top.share * 100:.0f} % of {of} (py-spy)")
    return FindingWhere(finding_id, total_s * 1e3, covered_s * 1e3, tuple(lines), where, entry)


def with_where(findings: list, wheres: list[FindingWhere]) -> list:
    """``findings`` with ``where`` set from the join (the first line of each finding's)."""
    lines = {w.finding: w.where for w in wheres if w.where}
    return [dataclasses.replace(f, where=lines[f.id]) if f.id in lines and not f.where else f
            for f in findings]


def format_where(wheres: list[FindingWhere], rate: int) -> str:
    """The report's section; empty when there is nothing to say."""
    if not wheres:
        return ""
    from gputop.core.format import safe_text

    lines = [f"Where in the code (py-spy samples at {rate}/s, joined to the trace's steps)"]
    for w in wheres:
        cover = (f", {w.covered_ms / w.total_ms * 100:.0f} % of it sampled"
                 if w.total_ms and w.covered_ms < 0.95 * w.total_ms else "")
        lines.append(f"  {w.finding} ({w.total_ms:.1f} ms{cover}):")
        if w.entry is not None:
            e = w.entry
            lines.append(safe_text(f"    {e.share * 100:5.1f} %  {e.ms:8.1f} ms  "
                                   f"{e.frame.location()} {e.frame.function}, all its lines  "
                                   f"[{e.who}]"))
        for line in w.lines:
            lines.append(safe_text(f"    {line.share * 100:5.1f} %  {line.ms:8.1f} ms  "
                                   f"{line.text()}  [{line.who}]"))
    return "\n".join(lines)
