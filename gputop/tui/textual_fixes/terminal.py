"""Terminal life: survive the terminal going away (an SSH drop) and leave cleanly.

When the terminal hangs up, writes to it fail with EIO. Textual's output thread would die on
the first such error and its queue would fill, so the app hangs while shutting down. This driver
swallows output errors once the terminal is gone and turns an input error into a clean exit.
"""

from __future__ import annotations

import os
import selectors
import threading
from codecs import getincrementaldecoder
from typing import Any

from textual._time import get_time
from textual._xterm_parser import XTermParser
from textual.message import Message

try:
    from textual.drivers.linux_driver import LinuxDriver
except ImportError:  # not a Unix system: Textual picks its own driver
    LinuxDriver = None  # type: ignore[assignment,misc]

# After a hangup, give the normal shutdown this long before leaving without it.
HANGUP_GRACE_S = 3.0


class TerminalLost(Message):
    """The terminal stopped answering (read or write failed)."""


class _TerminalOut:
    """The terminal as a file that stops writing, instead of raising, once it has gone."""

    def __init__(self, file: Any) -> None:
        self._file = file
        self.gone = False

    def write(self, text: str) -> int:
        if not self.gone:
            try:
                self._file.write(text)
            except OSError:
                self.gone = True
        return len(text)

    def flush(self) -> None:
        if not self.gone:
            try:
                self._file.flush()
            except OSError:
                self.gone = True

    def fileno(self) -> int:
        return self._file.fileno()

    def isatty(self) -> bool:
        return True

    def __getattr__(self, name: str) -> Any:
        return getattr(self._file, name)


class WakingEvent(threading.Event):
    """The input thread's exit flag, which also wakes the thread's ``select`` (a byte on a
    pipe), so that the thread can wait for input without a timeout."""

    def __init__(self) -> None:
        super().__init__()
        self.read_fd, self._write_fd = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)

    def set(self) -> None:
        super().set()
        try:
            os.write(self._write_fd, b"x")
        except OSError:  # the pipe is full: it is readable already
            pass

    def drain(self) -> None:
        try:
            while os.read(self.read_fd, 64):
                pass
        except OSError:  # empty
            pass


# The parser's escape timeout when this Textual has no ``_timeout_time`` to read: poll.
POLL_S = 0.1


if LinuxDriver is not None:

    class HangupSafeDriver(LinuxDriver):
        def __init__(self, app, **kwargs) -> None:
            super().__init__(app, **kwargs)
            self._file = _TerminalOut(self._file)
            self.exit_event = WakingEvent()

        def run_input_thread(self) -> None:
            try:
                self._read_input()
            except OSError:
                self._app.post_message(TerminalLost())

        def _read_input(self) -> None:
            """Textual's input loop (LinuxDriver.run_input_thread), waiting in ``select``
            until a key comes, the parser's escape timeout is due or the exit flag is set.
            Textual's wakes 10 times a second to check both: 0.8 ms of CPU a second on the
            tour, ~5 % of the monitor's."""
            wake = self.exit_event
            assert isinstance(wake, WakingEvent)
            wake.drain()  # a byte left by the last exit (suspend and resume)
            fileno = self.fileno
            selector = selectors.SelectSelector()
            selector.register(fileno, selectors.EVENT_READ)
            selector.register(wake.read_fd, selectors.EVENT_READ)
            parser = XTermParser(self._debug)
            decode = getincrementaldecoder("utf-8")().decode

            def process(ready: bool, final: bool = False) -> None:
                if ready:
                    data = decode(os.read(fileno, 4096), final=final)
                    for event in parser.feed(data) if data else ():
                        self.process_message(event)
                for event in parser.tick():
                    self.process_message(event)

            try:
                while not wake.is_set():
                    due = getattr(parser, "_timeout_time", get_time() + POLL_S)
                    timeout = None if due is None else max(0.0, due - get_time())
                    events = selector.select(timeout)
                    process(any(key.fd == fileno for key, _ in events))
                selector.unregister(fileno)
                process(False, final=True)
            finally:
                selector.close()
                try:
                    for _ in parser.feed(""):
                        pass
                except Exception:  # EOFError, ParseError: the parser's end, as Textual's
                    pass

else:  # pragma: no cover - Unix only in practice
    HangupSafeDriver = None  # type: ignore[assignment,misc]


def exit_soon_anyway(code: int, grace: float = HANGUP_GRACE_S) -> None:
    """A last resort after a hangup: if the orderly exit has not finished within ``grace``
    seconds, leave without it (demo stand-ins die with us through PR_SET_PDEATHSIG)."""
    timer = threading.Timer(grace, os._exit, (code,))
    timer.daemon = True
    timer.start()
