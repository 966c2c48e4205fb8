"""A memory report as text (`gputop memory`, the monitor's memory screen), every line escaped
(the report is untrusted), and the one line a live finding's "where" gets from it."""

from __future__ import annotations

import time

from gputop.capture.memory.report import GrowthLine, MemoryReport, Place
from gputop.capture.memory.verdict import size, verdicts
from gputop.core.format import safe_text

PARTS = ("activations", "parameters", "gradients", "optimizer_state", "other")
BAR = 24


def report_json(report: MemoryReport, path: str | None) -> dict:
    """The report as `gputop memory --json` prints it: the report's own fields, "report": its
    path and "verdicts" (what it says, judged)."""
    data = report.to_json()
    data["report"] = path
    data["verdicts"] = [v.to_json() for v in verdicts(report)]
    return data


def _place(p: Place) -> str:
    where = p.location()
    if where is None:
        return "(no Python frame: C++ or autograd's backward thread)"
    return f"{where} {p.function}" if p.function else where


def growth_line(report: MemoryReport) -> str | None:
    """The finding's "where" after a memory capture: the line that grows, and by how much."""
    if not report.growth:
        return None
    top = report.growth[0]
    where = _place(top)
    return safe_text(f"{where} keeps +{size(top.bytes_per_step)} per step (memory capture "
                     f"of pid {report.pid}, {_clock(report.time, '%H:%M:%S')})")


def _clock(t: float, fmt: str) -> str:
    """A report's time as a clock; one no calendar shows is "time unknown" (the decoder
    refuses such reports, this keeps a report made in memory from raising)."""
    try:
        return time.strftime(fmt, time.localtime(t))
    except (OverflowError, OSError, ValueError):
        return "time unknown"


def peak_line(report: MemoryReport) -> str | None:
    """When nothing grows: what makes the peak, for the finding's "where"."""
    p = report.peak
    if p is None:
        return None
    name = max(PARTS, key=lambda n: getattr(p.parts, n))
    top = p.activation_lines[0] if name == "activations" and p.activation_lines else None
    return safe_text(f"nothing grows; the peak ({size(p.bytes)}) is mostly "
                     f"{name.replace('_', ' ')} ({size(getattr(p.parts, name))})"
                     + (f", most made at {_place(top)}" if top is not None else "")
                     + f" (memory capture of pid {report.pid})")


def _growth(report: MemoryReport) -> list[str]:
    if not report.growth:
        return [f"Growth: none: nothing made in the {report.steps} recorded step(s) stayed "
                "alive beyond what the first one kept"]
    total = sum(x.bytes_per_step for x in report.growth)
    out = [f"Growth: +{size(total)} per step (allocations of the {report.steps} recorded steps "
           "still alive at the end, beyond what the warm-up step kept), by line:"]
    for g in report.growth:
        out.extend(_growth_entry(g))
    return out


def _growth_entry(g: GrowthLine) -> list[str]:
    steady = "rose every step" if g.steady else "not every step"
    out = [f"  +{size(g.bytes_per_step)}/step  {_place(g)}  ({size(g.bytes)} in "
           f"{g.count} allocation{'s' if g.count != 1 else ''}, {steady})"]
    if g.code:
        out.append(f"      {g.code}")
    if g.kept_by:
        out.append(f"      kept by: {g.kept_by}")
    return out


def _peak(report: MemoryReport) -> list[str]:
    p = report.peak
    if p is None:
        return []
    seen = ("allocated on the device" if p.absolute else
            "the model's tensors and what the capture saw allocated")
    out = [f"Peak of step {p.step} of the capture: {size(p.bytes)} ({seen})"
           + (f", reserved {size(p.reserved)}" if p.reserved is not None else "")]
    for name in PARTS:
        value = getattr(p.parts, name)
        share = value / p.bytes if p.bytes else 0.0
        bar = "█" * round(share * BAR)
        out.append(f"  {name.replace('_', ' '):<16} {size(value):>10}  {share:>4.0%}  {bar}")
    if p.activation_lines:
        out.append("  activations by line:")
        out.extend(_sized_lines(p.activation_lines, "    "))
    return out


def _sized_lines(lines, indent: str) -> list[str]:
    """The first 8 of a list of source lines with their bytes, one a row."""
    return [f"{indent}{size(x.bytes):>10}  {_place(x)}" for x in lines[:8]]


def _allocator(report: MemoryReport) -> list[str]:
    a = report.allocator
    out = []
    if a.caching and a.reserved is not None:
        line = f"Allocator: reserved {size(a.reserved)}, allocated {size(a.allocated)}"
        if a.device_total is not None:
            line += f" of the device's {size(a.device_total)} ({size(a.device_free)} free)"
        out.append(line)
        s = a.segments
        if s is not None:
            out.append(f"  {s.count} segments ({s.large} large, {s.small} small); "
                       f"{size(s.free)} free in {s.free_blocks} blocks, the largest "
                       f"{size(s.largest_free)}")
        if a.inactive_split is not None:
            out.append(f"  non-releasable (free in split segments): {size(a.inactive_split)}")
        if a.settings or a.expandable_segments is not None:
            out.append(f"  settings: {a.settings or '(defaults)'}"
                       + ("" if a.expandable_segments is None
                          else f"; expandable_segments {a.expandable_segments}"))
    pr = report.process
    if pr.rss is not None:
        line = f"Process: RSS {size(pr.rss)} (peak {size(pr.rss_peak)})"
        if pr.limit_address_space is not None:
            line += (f"; address space {size(pr.address_space)} of its "
                     f"{size(pr.limit_address_space)} limit (RLIMIT_AS)")
        if pr.cgroup_max is not None:
            line += f"; cgroup {size(pr.cgroup_current)} of {size(pr.cgroup_max)}"
        out.append(line)
    m = report.model
    out.append(f"Model: parameters {size(m.parameters)}, gradients {size(m.gradients)}, "
               f"optimizer state {size(m.optimizer_state)}")
    return out


def _oom(report: MemoryReport) -> list[str]:
    o = report.oom
    if o is None:
        return []
    when = _clock(report.time, "%Y-%m-%d %H:%M:%S")
    out = [f"Out of memory in pid {report.pid} on {report.device} at step {o.step} ({when}): "
           f"{o.exception}" + ("" if o.fatal else " (seen by the allocator; the job may have "
                                                  "caught it)")]
    if o.requested is not None:
        out.append(f"  asked for {size(o.requested)}"
                   + (f"; the device had {size(o.device_free)} free of {size(o.device_total)}"
                      if o.device_free is not None and o.device_total is not None else ""))
    if o.message:
        out.append(f"  {o.message[:300]}")
    if o.where is not None:
        out.append(f"  at {_place(o.where)}" + (f": {o.where.code}" if o.where.code else ""))
    for frame in o.stack[1:6]:
        out.append(f"     from {_place(frame)}")
    c = report.census
    if c is not None:
        out.append(f"What held the memory (the tensors Python can see on {report.device}: "
                   f"{size(c.tensor_bytes)} in {c.tensors})")
        for h in c.held_by:
            out.append(f"  {size(h.bytes):>10}  {h.what}")
        if c.cut:
            out.append(f"  ({c.cut})")
    if report.live_lines:
        out.append("Live allocations by line (the allocator's history):")
        out.extend(_sized_lines(report.live_lines, "  "))
    return out


def format_report(report: MemoryReport, path: str | None = None,
                  command: str | None = None) -> str:
    """The whole report, escaped."""
    lines: list[str] = []
    if report.kind == "capture":
        how = {"profiler": "the profiler's memory events",
               "allocator-history": "the CUDA caching allocator's history"}.get(report.source,
                                                                                report.source)
        head = (f"Memory of pid {report.pid}" + (f" ({command})" if command else "")
                + f" on {report.device}: {report.steps} step(s)"
                + (f" from step {report.first_step}" if report.first_step is not None else "")
                + (f", {report.window_s:.2f} s" if report.window_s is not None else "")
                + f", from {how}")
        lines.append(head)
        lines.append("")
        lines.extend(_verdicts(report))
        lines.append("")
        lines.extend(_growth(report))
        lines.append("")
        lines.extend(_peak(report))
    else:
        lines.extend(_oom(report))
        lines.append("")
        lines.extend(_verdicts(report))
        if report.growth:
            lines.append("")
            lines.append("What grew in this process's last memory capture:")
            for g in report.growth[:5]:
                lines.extend(_growth_entry(g))
    lines.append("")
    lines.extend(_allocator(report))
    for note in report.notes:
        lines.append(f"note: {note}")
    for cut in report.cut:
        lines.append(f"cut: {cut}")
    if path:
        lines.append(f"report: {path}")
    # Each line escaped whole: a newline inside a field shows as \x0a, never as a line.
    return "\n".join(safe_text(line) for line in lines)


def _verdicts(report: MemoryReport) -> list[str]:
    out = []
    for v in verdicts(report):
        out.append(f"* {v.text}")
        if v.fix:
            out.append(f"    fix: {v.fix}")
    return out
