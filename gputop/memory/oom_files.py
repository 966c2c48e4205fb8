"""Where a process's out-of-memory report is, after the process is gone.

The agent writes the report into the job's capture directory (which ``gputop run
--capture-dir`` may have set) and a one-line pointer ``<pid>.oom`` naming it beside its
socket, in this user's private socket directory (``agent.oom``). A pid is looked up there
first, then in this side's capture directory (``*_<pid>.<ms>.oom.json``, the newest).
The pointer is read as untrusted: one absolute path to a ``.oom.json`` file, bounded.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from gputop.memory.report import ReportError
from gputop.protocol import AgentError, default_capture_dir, socket_dir

MAX_POINTER = 4096
_REPORT_NAME = re.compile(r"^[^/]*_([1-9][0-9]{0,9})\.([0-9]{1,16})\.oom\.json$")


def _pointer(pid: int) -> str | None:
    try:
        path = socket_dir() / f"{pid}.oom"
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except (OSError, AgentError):
        return None
    try:
        text = os.read(fd, MAX_POINTER + 1).decode("utf-8", "replace").strip()
    except OSError:
        return None
    finally:
        os.close(fd)
    if (len(text) > MAX_POINTER or "\n" in text or "\0" in text or not os.path.isabs(text)
            or not text.endswith(".oom.json")):
        return None
    return text


def _newest_in(directory: Path, pid: int) -> str | None:
    best: tuple[int, str] | None = None
    try:
        entries = os.scandir(directory)
    except OSError:
        return None
    with entries:
        for entry in entries:
            found = _REPORT_NAME.match(entry.name)
            if found is None or int(found.group(1)) != pid:
                continue
            stamp = int(found.group(2))
            if best is None or stamp > best[0]:
                best = (stamp, entry.path)
    return None if best is None else best[1]


def oom_report_of(pid: int) -> str | None:
    """The newest out-of-memory report of ``pid``, or None."""
    pointed = _pointer(pid)
    if pointed is not None and os.path.isfile(pointed):
        return pointed
    return _newest_in(default_capture_dir(), pid)


def resolve_target(target: str) -> str:
    """``--last-oom PID-or-FILE``: the report's path (``ReportError`` when there is none)."""
    text = target.strip()
    if text.isdigit():
        pid = int(text)
        if not 0 < pid < 1 << 31:
            raise ReportError(f"{target!r}: not a process id")
        found = oom_report_of(pid)
        if found is None:
            raise ReportError(
                f"no out-of-memory report for pid {pid} (looked for {socket_dir()}/{pid}.oom "
                f"and {default_capture_dir()}/*_{pid}.*.oom.json): its agent saw no "
                "out-of-memory error, or the job ran without the agent (gputop run)")
        return found
    return text
