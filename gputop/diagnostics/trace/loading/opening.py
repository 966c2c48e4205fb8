"""How a trace file is opened, before a byte of it is read: the bounds on what one trace may
cost (``LoadLimits``) and the checks on the file itself (a device or FIFO not opened unless
asked, another user's symbolic link not followed, a file named by another user's agent that
must be that user's own, a size over the limit refused unread). ``load.py`` reads what this
module opened."""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass


class TraceError(Exception):
    """The file cannot be analysed; the message is one line, meant for the user."""


# What one held event costs, measured (benchmarks/bench_analyze_big.py): the Event struct,
# its strings and its share of the lists and the metrics built from them.
BYTES_PER_EVENT = 700
MAX_EVENTS = 3_000_000  # ~2 GB of memory for the analysis, whatever the file's size
STREAM_ABOVE = 64 << 20  # bytes of JSON decoded whole; a larger trace is read in batches


@dataclass(frozen=True)
class LoadLimits:
    """Bounds on what one trace may cost, so a hostile or broken file (a gzip bomb, /dev/zero,
    a FIFO) fails in one line instead of taking the machine's memory or hanging.

    Memory is bounded by the events held (``max_events``, ~700 bytes each), not by the size of
    the file: a trace of any size is read in batches. Past ``max_events`` the least telling
    events are cut (and the analysis says so); device work and steps beyond it refuse the
    trace. ``max_bytes`` (JSON after decompression) refuses larger files when set: unset by
    default, since bytes cost time, not memory; `gputop analyze --max-trace-mb` sets it."""

    max_bytes: int | None = None
    max_events: int = MAX_EVENTS
    allow_special: bool = False  # read a FIFO or device (e.g. <(zcat trace.gz)) when asked
    # A trace named by another user's agent (root capturing a user's job): the file must be
    # that user's own, and its last path component is not followed if it is a link.
    owner_uid: int | None = None
    follow_links: bool = True
    # What ``max_bytes`` is, for the error: the option that set it, or the capture's budget.
    bytes_limit_name: str = "the --max-trace-mb limit"


DEFAULT_LIMITS = LoadLimits()


def too_large(path: str, limits: LoadLimits) -> TraceError:
    """The refusal of a file over ``max_bytes`` (only raised when it is set)."""
    limit = limits.max_bytes or 0
    return TraceError(f"{path}: larger than {limit / 1e6:g} MB of JSON "
                      f"({limits.bytes_limit_name})")


def _refuse_before_open(path: str, limits: LoadLimits) -> None:
    """What is refused from the path alone, with one lstat: anything but a regular file named
    by another user's agent (opening some devices has effects), and a symbolic link another
    user made (as the kernel's protected_symlinks does in a sticky folder: in a shared folder
    it can point root at any file)."""
    try:
        st = os.lstat(path)
    except OSError:
        return  # the open says what is wrong
    if limits.owner_uid is not None and not stat.S_ISREG(st.st_mode):
        raise TraceError(f"{path}: not a regular file; not read for another user's agent")
    if stat.S_ISLNK(st.st_mode) and st.st_uid not in (os.geteuid(), 0):
        raise TraceError(f"{path}: is a symbolic link owned by uid {st.st_uid}, not by you; "
                         "not followed")


def open_checked(path: str, limits: LoadLimits) -> int:
    """A descriptor of the trace at ``path`` once every check on the file itself holds."""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0)
    if not limits.follow_links:
        flags |= getattr(os, "O_NOFOLLOW", 0)
    _refuse_before_open(path, limits)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if exc.errno == getattr(os, "ELOOP", -1) and not limits.follow_links:
            raise TraceError(f"{path}: is a symbolic link; not followed for a trace named by "
                             "another user's agent") from None
        if isinstance(exc, FileNotFoundError):
            raise TraceError(f"{path}: no such file") from None
        if isinstance(exc, IsADirectoryError):
            raise TraceError(f"{path}: is a directory, not a trace file") from None
        if isinstance(exc, PermissionError):
            raise TraceError(f"{path}: permission denied") from None
        raise TraceError(f"{path}: cannot read ({exc.strerror or exc})") from None
    try:
        st = os.fstat(fd)
        mode = st.st_mode
        if stat.S_ISDIR(mode):
            raise TraceError(f"{path}: is a directory, not a trace file")
        if limits.owner_uid is not None and st.st_uid != limits.owner_uid:
            raise TraceError(f"{path}: owned by uid {st.st_uid}, not by the agent's uid "
                             f"{limits.owner_uid}; not read")
        # gzip adds a few bytes per 32 KiB at worst: a file this much larger is over the limit
        # whatever it holds (a 5 GB sparse file is refused without reading it).
        if (limits.max_bytes is not None and stat.S_ISREG(mode)
                and st.st_size > limits.max_bytes * 1.01 + 4096):
            raise too_large(path, limits)
        if not stat.S_ISREG(mode):
            if not limits.allow_special:
                raise TraceError(f"{path}: not a regular file (a device, FIFO or socket); "
                                 "pass --allow-special-files to read one")
            os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd
