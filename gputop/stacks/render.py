"""A ``StackReport`` as text: for `gputop stacks` and the TUI's stacks view.

Every name, path and command line comes from the sampled process: escaped with ``safe_text``.
"""

from __future__ import annotations

from gputop.core.format import safe_text
from gputop.stacks.profile import Entry, ProcessStacks, StackReport, ThreadNow, where_line

TOP_SHOWN = 5
FRAMES_HUNG = 64  # frames of each thread's current stack when the process looks hung
HUNG_ACTIVE_SHARE = 0.05  # a process whose threads ran under 5 % of the time looks stuck


def _entry(entry: Entry) -> str:
    frame = entry.frame
    text = f"{entry.share * 100:5.1f} %  {frame.function} ({frame.location()})"
    if entry.caller is not None:
        text += f"  in {entry.caller.function} ({entry.caller.location()})"
    return safe_text(text)


THREADS_SHOWN = 4


def _activity(proc: ProcessStacks) -> str:
    """"running: MainThread 98 %, QueueFeederThread 0 % ...": per thread, since one busy
    thread beside two idle helpers is a saturated process, not a third-busy one."""
    share = proc.active_share
    threads = f"{proc.threads} thread{'s' if proc.threads != 1 else ''}"
    if share is None:
        return f"no samples ({threads})"
    if not proc.by_thread:
        return f"active {share * 100:.0f} % of {proc.samples} samples ({threads})"
    parts = [f"{t.name or f'thread {t.tid}'} {t.active_share * 100:.0f} %"
             for t in proc.by_thread[:THREADS_SHOWN]]
    more = len(proc.by_thread) - THREADS_SHOWN
    tail = f", {more} more" if more > 0 else ""
    return safe_text(f"{threads}, running: {', '.join(parts)}{tail}")


def _thread_head(thread: ThreadNow) -> str:
    state = {True: "active", False: "idle", None: "state unknown"}[thread.active]
    if thread.holds_gil:
        state += ", holds the GIL"
    return f"thread {thread.tid} {thread.name or '(unnamed)'} ({state})"


def _thread_line(thread: ThreadNow) -> str:
    """One line: the innermost frame, and the innermost one of the user's own code."""
    if not thread.frames:
        return safe_text(f"    {_thread_head(thread)}: no Python frames")
    leaf = thread.frames[0]
    text = f"    {_thread_head(thread)}: {leaf.function} ({leaf.location()})"
    user = next((f for f in thread.frames if not f.is_library), None)
    if user is not None and user != leaf:
        text += f" in {user.function} ({user.location()})"
    return safe_text(text)


def _thread(thread: ThreadNow, frames: int) -> list[str]:
    lines = [safe_text(f"    {_thread_head(thread)}")]
    for frame in thread.frames[:frames]:
        lines.append(safe_text(f"      {frame.function} ({frame.location()})"))
    if len(thread.frames) > frames:
        lines.append(f"      … {len(thread.frames) - frames} outer frames")
    if not thread.frames:
        lines.append("      (no Python frames)")
    return lines


def looks_hung(proc: ProcessStacks) -> bool:
    """No thread of it ran more than a few percent of the time."""
    if proc.by_thread:
        return max(t.active_share for t in proc.by_thread) < HUNG_ACTIVE_SHARE
    share = proc.active_share
    return share is not None and share < HUNG_ACTIVE_SHARE


def process_lines(proc: ProcessStacks) -> list[str]:
    if proc.role == "main":
        who = f"main process {proc.pid}"
    elif proc.role == "worker":
        who = f"worker {proc.pid}"
    else:
        who = f"process {proc.pid} (under pid {proc.parent})"
    lines = [f"{who}: {_activity(proc)}"]
    if proc.top_functions:
        lines.append("  top functions (share of its active samples)")
        lines += [f"    {_entry(e)}" for e in proc.top_functions[:TOP_SHOWN]]
        lines.append("  top lines")
        lines += [f"    {_entry(e)}" for e in proc.top_lines[:TOP_SHOWN]]
    else:
        lines.append("  no active samples: no Python code ran")
    if proc.idle_in:
        lines.append("  idle, waiting in (share of its idle samples)")
        lines += [f"    {_entry(e)}" for e in proc.idle_in[:3]]
    if proc.now and looks_hung(proc):
        lines.append("  threads now (idle the whole time: whole stacks)")
        for thread in proc.now:
            lines += _thread(thread, FRAMES_HUNG)
    elif proc.now:
        lines.append("  threads now")
        lines += [_thread_line(thread) for thread in proc.now]
    return lines


def format_stacks(report: StackReport, command: str | None = None) -> str:
    head = f"gputop stacks: pid {report.pid}"
    if command:
        command = safe_text(command)
        head += f" ({command if len(command) <= 80 else command[:79] + '…'})"
    head += (f", {report.seconds:g} s at {report.rate} samples/s per thread, "
             f"{len(report.workers)} worker{'s' if len(report.workers) != 1 else ''}")
    children = len(report.others) - len(report.workers)
    if children:
        head += f", {children} other Python process{'es' if children != 1 else ''}"
    lines = [head]
    if report.main is None or not report.main.samples:
        lines.append(f"pid {report.pid} itself runs no Python"
                     + (": the Python processes under it follow" if report.others else ""))
    where = where_line(report)
    if where:
        lines.append(f"where: {safe_text(where)}")
    for proc in report.processes:
        lines.append("")
        lines += process_lines(proc)
    notes = list(report.notes)
    if report.sample_errors:
        notes.append(f"{report.sample_errors} samples could not be read (the stack changed "
                     "while py-spy read it) and were dropped")
    if report.unparsed:
        notes.append(f"{report.unparsed} lines of py-spy output did not parse and were skipped")
    if notes:
        lines.append("")
        lines += [f"note: {safe_text(n)}" for n in notes]
    return "\n".join(lines)
