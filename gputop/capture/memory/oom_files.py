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
import stat
import time
from pathlib import Path
from typing import TYPE_CHECKING

from gputop.capture.memory.report_error import ReportError
from gputop.core.protocol import AgentError, default_capture_dir, socket_dir

if TYPE_CHECKING:
    from gputop.capture.memory.report import MemoryReport

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


MAX_CANDIDATES = 16  # reports of one pid tried, newest first
FUTURE_S = 86400.0  # a stamp further ahead than this is no time a report was written


def _candidates(directory: Path, pid: int, owners: frozenset[int]) -> list[str]:
    """The reports named for ``pid`` in ``directory`` that ``owners`` wrote, newest stamp first
    (at most ``MAX_CANDIDATES``; a stamp in the future is a forgery's, never the newest).
    Whose file it is is checked before the bound: in a shared folder another user's files,
    however many and however new, never fill it."""
    found: list[tuple[int, str]] = []
    limit = (time.time() + FUTURE_S) * 1000
    try:
        entries = os.scandir(directory)
    except OSError:
        return []
    with entries:
        for entry in entries:
            match = _REPORT_NAME.match(entry.name)
            if match is None or int(match.group(1)) != pid:
                continue
            try:
                st = entry.stat(follow_symlinks=False)  # a link is no report (not followed)
            except OSError:
                continue
            if not stat.S_ISREG(st.st_mode) or st.st_uid not in owners:
                continue
            stamp = int(match.group(2))
            if stamp <= limit:
                found.append((stamp, entry.path))
    return [path for _, path in sorted(found, reverse=True)[:MAX_CANDIDATES]]


def _owners(pid: int) -> frozenset[int]:
    """Whose report of ``pid`` is believed: the process's user while it runs, the caller (whose
    process it was, if it is gone) and root."""
    uids = {os.geteuid(), 0}
    try:
        uids.add(os.stat(f"/proc/{pid}").st_uid)
    except OSError:
        pass
    return frozenset(uids)


def oom_report_of(pid: int) -> str | None:
    """The newest out-of-memory report of ``pid`` that can be trusted, or None."""
    found = last_oom_of(pid)
    return None if found is None else found[0]


def last_oom_of(pid: int) -> tuple[str, MemoryReport] | None:
    """The newest trusted out-of-memory report of ``pid`` and its path: the pointer in the
    caller's own socket folder, else the capture folder's reports named for the pid. A file is
    believed only if owned by the process's user or root (``_owners``), not through another
    user's link, and naming the same pid; the others are passed over."""
    owners = _owners(pid)
    pointed = _pointer(pid)
    paths = ([pointed] if pointed is not None else []) + _candidates(default_capture_dir(), pid, owners)
    if not paths:
        return None  # the usual case (a process that ended well): the reader is not loaded
    from gputop.capture.memory.report import read_report  # msgspec: only with a report to read

    for path in paths:
        try:
            report = read_report(path, owners=owners)
        except ReportError:
            continue
        if report.pid == pid and report.kind == "oom":
            return path, report
    return None


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
                f"and {default_capture_dir()}/*_{pid}.*.oom.json owned by its user or root): "
                "its agent saw no out-of-memory error, or the job ran without the agent "
                "(gputop run)")
        return found
    return text


def read_last_oom(target: str) -> tuple[str, MemoryReport, int | None]:
    """``--last-oom PID-or-FILE`` read: by pid, the trusted report found for it (read once, so
    what was checked is what is shown; no owner: it is the process's user's or root's); a file,
    read as ``read_report`` reads a path, with the uid that owns it (anyone can write a report
    naming any pid: whose file it is is part of what is shown)."""
    text = target.strip()
    if text.isdigit():
        path = resolve_target(text)  # its errors name what was looked for
        found = last_oom_of(int(text))
        if found is None:  # it changed since: the same answer as no report at all
            raise ReportError(f"no out-of-memory report for pid {text} any more ({path})")
        return found[0], found[1], None
    from gputop.capture.memory.report import read_report_owned

    report, owner = read_report_owned(text)
    return text, report, owner


def whose_file(uid: int) -> str:
    """``uid 65534 (nobody)``: a file's owner as said to the user."""
    import pwd

    try:
        name = pwd.getpwuid(uid).pw_name
    except (KeyError, OverflowError):
        return f"uid {uid}"
    return f"uid {uid} ({name})"
