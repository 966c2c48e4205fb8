"""Keep the profiler's own lines out of the job's stderr.

torch's profiler writes to file descriptor 2 from C++: Kineto's ``USDT: ...
SyncActivityProfilerHandler.cpp:52] profiler_start`` / ``profiler_stop`` at every start and
stop, and c10's ``[W... CPUAllocator.cpp:245] Memory block of unknown size ...`` when a block
allocated before a memory capture is freed during it. The job's logs are the user's, so while
gputop's instruments are on, fd 2 is a pipe: a thread forwards everything the job writes to the
real stderr, at once and in order, and drops only those lines. Their log levels cannot be
changed at run time (they are read when torch loads).

Bounded and harmless: nothing is held back but a few bytes that may begin one of those lines;
when the pipe or the thread cannot be made, nothing changes; a process forked meanwhile (a
DataLoader worker) keeps the pipe as its stderr and the thread forwards it until it exits.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager

# What the profiler writes; nothing else is dropped.
PROFILER_LINE = re.compile(
    rb"^(USDT:.*\] profiler_(start|stop)\s*$"
    rb"|\[W\d{4} [\d:.]+ +\d* *CPUAllocator\.cpp:\d+\] Memory block of unknown size.*$)")
STARTS = (b"USDT:", b"[W")  # a partial line that may become one is held until its newline
HOLD_MAX = 4096  # a longer partial line is forwarded as it is

_lock = threading.Lock()
_users = 0
_saved: int | None = None  # the real stderr while the filter is on
_thread: threading.Thread | None = None
DRAIN_S = 0.2  # end() waits this long at most for the job's last lines to be forwarded


def _forward(read_fd: int, out_fd: int) -> None:
    held = b""
    try:
        while True:
            try:
                chunk = os.read(read_fd, 65536)
            except InterruptedError:
                continue
            if not chunk:
                break
            held += chunk
            lines = held.split(b"\n")
            held = lines.pop()
            out = b"".join(line + b"\n" for line in lines if not PROFILER_LINE.match(line))
            if held and (len(held) > HOLD_MAX or not any(
                    held.startswith(s[:len(held)]) or held.startswith(s) for s in STARTS)):
                out, held = out + held, b""
            _write_all(out_fd, out)
        if held and not PROFILER_LINE.match(held):
            _write_all(out_fd, held)
    finally:
        os.close(read_fd)
        os.close(out_fd)


def _write_all(fd: int, data: bytes) -> None:
    while data:
        try:
            data = data[os.write(fd, data):]
        except InterruptedError:
            continue
        except OSError:
            return  # the real stderr is gone (closed, a full disk): nothing to keep


def begin() -> None:
    """Route fd 2 through the filter (nested calls count; each needs its end())."""
    global _users, _saved, _thread
    with _lock:
        _users += 1
        if _users > 1:
            return
        try:
            saved = os.dup(2)
        except OSError:
            return
        try:
            read_fd, write_fd = os.pipe()
        except OSError:
            os.close(saved)
            return
        try:
            out = os.dup(saved)  # the thread's own copy: it closes it when done
            thread = threading.Thread(target=_forward, args=(read_fd, out),
                                      name="gputop-stderr", daemon=True)
            thread.start()
        except (OSError, RuntimeError):
            for fd in (saved, read_fd, write_fd):
                os.close(fd)
            return
        _flush_python()
        os.dup2(write_fd, 2)
        os.close(write_fd)
        _saved, _thread = saved, thread


def end() -> None:
    """Give fd 2 back to the real stderr once the last user is done."""
    global _users, _saved, _thread
    thread = None
    with _lock:
        if _users == 0:
            return
        _users -= 1
        if _users or _saved is None:
            return
        _flush_python()
        os.dup2(_saved, 2)  # the pipe's last writer closes: the thread drains it and ends
        os.close(_saved)
        _saved = None
        thread, _thread = _thread, None
    if thread is not None:
        # What the job wrote before this goes out before what it writes after (a forked child
        # that keeps the pipe open keeps the thread going: a bounded wait, then on).
        thread.join(DRAIN_S)


@contextmanager
def quiet() -> Iterator[None]:
    begin()
    try:
        yield
    finally:
        end()


def _flush_python() -> None:
    import sys

    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except (OSError, ValueError):
            pass
